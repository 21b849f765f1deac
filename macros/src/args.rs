//! The attribute's arguments: `cache = EXPR, key = "...", ttl_secs = N | ttl = EXPR,
//! options = EXPR`, each once, in any order; `cache`, `key` and one TTL are required.

use proc_macro2::Span;
use syn::meta::ParseNestedMeta;
use syn::{Expr, LitInt, LitStr};

/// What the whole argument list says, before it is checked for completeness.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) cache: Option<Expr>,
    pub(crate) key: Option<LitStr>,
    pub(crate) ttl: Option<Ttl>,
    pub(crate) options: Option<Expr>,
}

/// The two spellings of the TTL: a literal number of seconds (the common case, readable at a
/// glance) or any expression of type `Duration` (a constant, a computed value).
pub(crate) enum Ttl {
    Secs(LitInt),
    Expr(Expr),
}

const USAGE: &str = "#[cached] takes `cache = EXPR, key = \"template\", ttl_secs = N` \
    (or `ttl = DURATION_EXPR`) and optionally `options = CALL_OPTIONS_EXPR`";

impl Args {
    /// Reads one `name = value` of the list (the parser built by `syn::meta::parser` calls it
    /// for each), refusing an unknown name or one given twice.
    pub(crate) fn one(&mut self, meta: ParseNestedMeta<'_>) -> syn::Result<()> {
        let name = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let twice = |what: &str| meta.error(format!("`{what}` is given twice"));
        match name.as_str() {
            "cache" if self.cache.is_some() => return Err(twice("cache")),
            "cache" => self.cache = Some(meta.value()?.parse()?),
            "key" if self.key.is_some() => return Err(twice("key")),
            "key" => self.key = Some(meta.value()?.parse()?),
            "ttl" | "ttl_secs" if self.ttl.is_some() => {
                return Err(meta.error(
                    "give the TTL once: either `ttl_secs = 300` or \
                     `ttl = Duration::from_secs(300)`",
                ))
            }
            "ttl_secs" => self.ttl = Some(Ttl::Secs(meta.value()?.parse()?)),
            "ttl" => self.ttl = Some(Ttl::Expr(meta.value()?.parse()?)),
            "options" if self.options.is_some() => return Err(twice("options")),
            "options" => self.options = Some(meta.value()?.parse()?),
            _ => return Err(meta.error(format!("unknown argument; {USAGE}"))),
        }
        Ok(())
    }

    /// The required arguments, or an error naming the first one missing.
    pub(crate) fn complete(self) -> syn::Result<Complete> {
        let missing = |what: &str, example: &str| {
            syn::Error::new(
                Span::call_site(),
                format!("#[cached] needs `{what}`, e.g. `{example}`; {USAGE}"),
            )
        };
        Ok(Complete {
            cache: self
                .cache
                .ok_or_else(|| missing("cache", "cache = self.cache"))?,
            key: self
                .key
                .ok_or_else(|| missing("key", "key = \"report:{month}\""))?,
            ttl: self
                .ttl
                .ok_or_else(|| missing("ttl_secs", "ttl_secs = 300"))?,
            options: self.options,
        })
    }
}

/// Every required argument present.
pub(crate) struct Complete {
    pub(crate) cache: Expr,
    pub(crate) key: LitStr,
    pub(crate) ttl: Ttl,
    pub(crate) options: Option<Expr>,
}
