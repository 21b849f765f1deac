//! The expansion: the function keeps its signature, and its body becomes one call of
//! `stampede_guard::__cached::run` with the cache, the key, the TTL, the options, the
//! original body as an `async move` block, and how the error type is written as text and made
//! from the cache's own (`error_handling`: where the error type is concrete).
//!
//! The body becomes a `'static` future because the cache may run it in a task of its own (a
//! refresh in the background outlives the call). So what it borrows is copied first: a
//! reference argument `month: &str` becomes an owned copy, borrowed again inside the block under
//! the same name and type; `&self` becomes a clone of `self` (a cheap handle), and the body's
//! `self` reads it (as `async-trait` does, the body's `self` tokens are renamed).

use proc_macro2::{Group, Ident, Spacing, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat, ReturnType, Type};

use crate::args::{Args, Ttl};
use crate::template;

/// The name the body's `self` is renamed to.
const SELF_COPY: &str = "__self";

pub(crate) fn expand(args: Args, mut function: ItemFn) -> syn::Result<TokenStream> {
    let args = args.complete()?;
    let sig = &function.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "#[cached] goes on an `async fn` (its body may wait for another caller's computation)",
        ));
    }
    let ReturnType::Type(_, returns) = &sig.output else {
        return Err(syn::Error::new_spanned(
            sig,
            "#[cached] needs a function that returns `Result<T, E>` \
             (T: the cached value, E: From<stampede_guard::Error>)",
        ));
    };

    let (body, uses_self) = rename_self(function.block.to_token_stream());
    let body = braces_of_the_expansion(body);
    let mut inputs = Inputs::default();
    for input in &sig.inputs {
        inputs.read(input, &body)?;
    }
    if uses_self {
        inputs.copy_self()?;
    }

    let template = args.key.value();
    let used = template::placeholders(&template, &inputs.names)
        .map_err(|message| syn::Error::new_spanned(&args.key, message))?;
    let used: Vec<Ident> = used
        .iter()
        .map(|n| Ident::new(n, Span::call_site()))
        .collect();
    let key = args.key;
    let cache = args.cache;
    let ttl = match args.ttl {
        Ttl::Secs(secs) => quote!(::core::time::Duration::from_secs(#secs)),
        Ttl::Expr(expr) => expr.to_token_stream(),
    };
    let options = match args.options {
        Some(options) => quote!(::core::option::Option::Some(#options)),
        None => quote!(::core::option::Option::None),
    };
    let (before, inside) = (inputs.before, inputs.inside);
    let errors = error_handling(returns);
    // `identity::<R>` names the block's type, so that `?` and `return` in the body convert to
    // the function's own `Result` as they did before.
    function.block = syn::parse_quote!({
        #before
        ::stampede_guard::__cached::run(
            &(#cache),
            ::std::format!(#key #(, #used = #used)*),
            #ttl,
            #options,
            async move {
                #inside
                ::core::convert::identity::<#returns>(#body)
            },
            #errors,
        )
        .await
    });
    Ok(function.into_token_stream())
}

/// How `run` writes a failed body's error as text, and makes the function's error from the
/// cache's: a closure that picks `Display`, `Debug` or the type's name by what the error type
/// has (auto-ref: the first trait whose bound holds), and `From<Error>`. Both name the error
/// type through the return type, spanned on it, so a type without `From<Error>` is one
/// compile error there, with the bound explained (`stampede_guard::__cached::CachedError`).
fn error_handling(returns: &Type) -> TokenStream {
    let span = returns.span();
    let error = quote_spanned!(span=>
        <#returns as ::stampede_guard::__cached::Returns>::Error
    );
    let from = quote_spanned!(span=> ::stampede_guard::__cached::from_error::<#error>);
    quote!((
        |error: &#error| {
            #[allow(unused_imports)]
            use ::stampede_guard::__cached::text::{
                DebugByDebug as _, DebugByDisplay as _, DebugByName as _,
                DisplayByDebug as _, DisplayByDisplay as _, DisplayByName as _,
            };
            let text = ::stampede_guard::__cached::text::Text(error);
            ((&&&text).display_text(), (&&&text).debug_text())
        },
        #from,
    ))
}

/// What the arguments need: their names (for the key template) and the statements that make
/// the body own what it borrows.
#[derive(Default)]
struct Inputs {
    names: Vec<String>,
    /// Run before the call: owned copies of borrowed arguments (and of `self`).
    before: TokenStream,
    /// Run at the top of the body: the borrowed names again, over the copies.
    inside: TokenStream,
    /// `&self`'s type, when the function has that receiver.
    receiver: Option<TokenStream>,
}

impl Inputs {
    fn read(&mut self, input: &FnArg, body: &TokenStream) -> syn::Result<()> {
        match input {
            FnArg::Receiver(receiver) => {
                let Type::Reference(reference) = &*receiver.ty else {
                    return Err(syn::Error::new_spanned(
                        receiver,
                        "#[cached] methods take `&self`: the body gets a clone of `self` \
                         (a cheap handle), since it may run after the call returns",
                    ));
                };
                if reference.mutability.is_some() {
                    return Err(syn::Error::new_spanned(
                        receiver,
                        "#[cached] methods take `&self`, not `&mut self`: the body runs once for \
                         many callers and may outlive this one",
                    ));
                }
                self.receiver = Some(reference.elem.to_token_stream());
                Ok(())
            }
            FnArg::Typed(typed) => {
                let name = match &*typed.pat {
                    Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => {
                        Some(pat.ident.clone())
                    }
                    _ => None,
                };
                if let Some(name) = &name {
                    self.names.push(name.to_string());
                }
                let Type::Reference(reference) = &*typed.ty else {
                    return Ok(()); // owned: moved into the body as it is
                };
                if reference.mutability.is_some() {
                    return Err(syn::Error::new_spanned(
                        &typed.ty,
                        "#[cached] cannot pass `&mut` arguments to a body that runs once for many \
                         callers: take the value, or `&T`",
                    ));
                }
                let Some(name) = name else {
                    return Err(syn::Error::new_spanned(
                        &typed.pat,
                        "#[cached]: give this borrowed argument a plain name, so that the body \
                         can get an owned copy of it",
                    ));
                };
                if !mentions(body, &name) {
                    return Ok(()); // only the key (or nothing) reads it: no copy
                }
                let copy = format_ident!("__owned_{}", name);
                let referent = &reference.elem;
                self.before.extend(quote! {
                    let #copy = ::std::borrow::ToOwned::to_owned(#name);
                });
                self.inside.extend(quote! {
                    #[allow(unused_variables)]
                    let #name: &#referent = ::std::borrow::Borrow::borrow(&#copy);
                });
                Ok(())
            }
        }
    }

    /// The body uses `self`: clone it before the call, borrow the clone inside.
    fn copy_self(&mut self) -> syn::Result<()> {
        let Some(referent) = &self.receiver else {
            return Err(syn::Error::new(
                Span::call_site(),
                "#[cached]: the body uses `self`, but the function takes no `&self`",
            ));
        };
        let copy = Ident::new(SELF_COPY, Span::call_site());
        self.before.extend(quote! {
            let #copy = ::core::clone::Clone::clone(self);
        });
        self.inside.extend(quote! {
            let #copy: &#referent = &#copy;
        });
        Ok(())
    }
}

/// The body with its outer braces spanned as the expansion's own, its contents untouched:
/// handed as an argument (`identity::<R>({ .. })`), a one-expression body's braces would
/// otherwise be the user's, and `unused_braces` would warn on every such function.
fn braces_of_the_expansion(body: TokenStream) -> TokenStream {
    body.into_iter()
        .map(|token| match token {
            TokenTree::Group(group) => {
                let mut outer = Group::new(group.delimiter(), group.stream());
                outer.set_span(Span::call_site());
                TokenTree::Group(outer)
            }
            other => other,
        })
        .collect()
}

/// Whether `name` appears in `tokens` (perhaps as a field or a shadowing binding: a copy too
/// many costs a clone, one too few would not compile).
fn mentions(tokens: &TokenStream, name: &Ident) -> bool {
    tokens.clone().into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == *name,
        TokenTree::Group(group) => mentions(&group.stream(), name),
        _ => false,
    })
}

/// The body with each `self` value renamed (paths such as `self::module` kept), and whether
/// there was one.
fn rename_self(tokens: TokenStream) -> (TokenStream, bool) {
    let mut found = false;
    let mut out = Vec::new();
    let mut tokens = tokens.into_iter().peekable();
    while let Some(token) = tokens.next() {
        match token {
            TokenTree::Ident(ident) if ident == "self" => {
                let path = matches!(tokens.peek(), Some(TokenTree::Punct(p))
                    if p.as_char() == ':' && p.spacing() == Spacing::Joint);
                if path {
                    out.push(TokenTree::Ident(ident));
                } else {
                    found = true;
                    out.push(TokenTree::Ident(Ident::new(SELF_COPY, ident.span())));
                }
            }
            TokenTree::Group(group) => {
                let (inner, inner_found) = rename_self(group.stream());
                found |= inner_found;
                let mut renamed = Group::new(group.delimiter(), inner);
                renamed.set_span(group.span());
                out.push(TokenTree::Group(renamed));
            }
            other => out.push(other),
        }
    }
    (out.into_iter().collect(), found)
}

#[cfg(test)]
mod tests {
    use super::{error_handling, expand, rename_self};
    use crate::args::Args;
    use proc_macro2::TokenStream;
    use quote::quote;
    use syn::parse::Parser;

    /// The expansion of `#[cached(args)] function`, or the compile error's message.
    fn expanded(args: TokenStream, function: TokenStream) -> Result<String, String> {
        let mut parsed = Args::default();
        syn::meta::parser(|meta| parsed.one(meta))
            .parse2(args)
            .map_err(|e| e.to_string())?;
        let function = syn::parse2(function).map_err(|e| e.to_string())?;
        expand(parsed, function)
            .map(|tokens| tokens.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_expansion_is_one_call_with_borrowed_arguments_copied() {
        let out = expanded(
            quote!(cache = REPORTS, key = "report:{month}", ttl_secs = 300),
            quote!(
                async fn total(month: &str) -> Result<u64, Error> {
                    Ok(month.len() as u64)
                }
            ),
        )
        .unwrap();
        let errors = error_handling(&syn::parse_quote!(Result<u64, Error>));
        let expected = quote!(
            async fn total(month: &str) -> Result<u64, Error> {
                let __owned_month = ::std::borrow::ToOwned::to_owned(month);
                ::stampede_guard::__cached::run(
                    &(REPORTS),
                    ::std::format!("report:{month}", month = month),
                    ::core::time::Duration::from_secs(300),
                    ::core::option::Option::None,
                    async move {
                        #[allow(unused_variables)]
                        let month: &str = ::std::borrow::Borrow::borrow(&__owned_month);
                        ::core::convert::identity::<Result<u64, Error>>({ Ok(month.len() as u64) })
                    },
                    #errors,
                )
                .await
            }
        );
        // Compared without spaces: `> >` and `>>` are the same tokens, spelt apart or joint.
        let plain = |s: &str| s.replace(' ', "");
        assert_eq!(plain(&out), plain(&expected.to_string()));
    }

    #[test]
    fn the_error_type_is_named_through_the_return_type_for_its_text_and_from() {
        let out = error_handling(&syn::parse_quote!(AppResult<u64>)).to_string();
        let plain = out.replace(' ', "");
        assert!(
            plain.contains("|error:&<AppResult<u64>as::stampede_guard::__cached::Returns>::Error|"),
            "{out}"
        );
        assert!(
            plain.contains("((&&&text).display_text(),(&&&text).debug_text())"),
            "{out}"
        );
        assert!(
            plain.contains(
                "::stampede_guard::__cached::from_error::<<AppResult<u64>as::stampede_guard::__cached::Returns>::Error>"
            ),
            "{out}"
        );
    }

    #[test]
    fn a_method_body_reads_a_clone_of_self() {
        let out = expanded(
            quote!(cache = self.cache, key = "k", ttl = TTL, options = opts()),
            quote!(
                async fn f(&self) -> Result<u64, Error> {
                    Ok(self.n)
                }
            ),
        )
        .unwrap();
        assert!(
            out.contains("let __self = :: core :: clone :: Clone :: clone (self) ;"),
            "{out}"
        );
        assert!(out.contains("let __self : & Self = & __self ;"), "{out}");
        assert!(out.contains("Ok (__self . n)"), "{out}");
        assert!(
            out.contains("& (self . cache)"),
            "the cache is read from the real self: {out}"
        );
        assert!(
            out.contains(":: core :: option :: Option :: Some (opts ())"),
            "{out}"
        );
    }

    #[test]
    fn misuses_are_compile_errors_that_say_what_to_write() {
        let f = quote!(
            async fn f(month: String) -> Result<u64, Error> {
                Ok(1)
            }
        );
        let error = |args, function| expanded(args, function).unwrap_err();
        let unknown = error(quote!(cache = C, key = "r:{mnth}", ttl_secs = 1), f.clone());
        assert!(
            unknown.contains("`mnth`") && unknown.contains("are: month"),
            "{unknown}"
        );
        let missing = error(quote!(cache = C, ttl_secs = 1), f.clone());
        assert!(missing.contains("needs `key`"), "{missing}");
        let no_ttl = error(quote!(cache = C, key = "k"), f.clone());
        assert!(no_ttl.contains("needs `ttl_secs`"), "{no_ttl}");
        let two = error(
            quote!(cache = C, key = "k", ttl_secs = 1, ttl = T),
            f.clone(),
        );
        assert!(two.contains("give the TTL once"), "{two}");
        let typo = error(quote!(cache = C, key = "k", ttl_sec = 1), f.clone());
        assert!(typo.contains("unknown argument"), "{typo}");
        let args = quote!(cache = C, key = "k", ttl_secs = 1);
        let sync = error(
            args.clone(),
            quote!(
                fn f() -> Result<u64, Error> {
                    Ok(1)
                }
            ),
        );
        assert!(sync.contains("`async fn`"), "{sync}");
        let unit = error(
            args.clone(),
            quote!(
                async fn f() {}
            ),
        );
        assert!(unit.contains("returns `Result<T, E>`"), "{unit}");
        let exclusive = error(
            args.clone(),
            quote!(
                async fn f(&mut self) -> R {
                    Ok(1)
                }
            ),
        );
        assert!(exclusive.contains("not `&mut self`"), "{exclusive}");
        let owned = error(
            args.clone(),
            quote!(
                async fn f(self) -> R {
                    Ok(1)
                }
            ),
        );
        assert!(owned.contains("take `&self`"), "{owned}");
        let mutable = error(
            args,
            quote!(
                async fn f(x: &mut u8) -> R {
                    Ok(1)
                }
            ),
        );
        assert!(mutable.contains("`&mut` arguments"), "{mutable}");
    }

    #[test]
    fn self_values_are_renamed_and_self_paths_kept() {
        let (out, found) = rename_self(quote!({ self.db.query(self::SQL, format!("{}", self.x)) }));
        assert!(found);
        assert_eq!(
            out.to_string(),
            quote!({ __self.db.query(self::SQL, format!("{}", __self.x)) }).to_string()
        );
        let (_, found) = rename_self(quote!({ super::f(x) }));
        assert!(!found);
    }

    #[test]
    fn a_borrowed_argument_only_the_key_reads_is_not_copied() {
        let out = expanded(
            quote!(cache = cache, key = "k:{month}", ttl_secs = 1),
            quote!(
                async fn f(cache: &Cache, month: &str) -> Result<u64, Error> {
                    Ok(month.len())
                }
            ),
        )
        .unwrap();
        assert!(!out.contains("__owned_cache"), "{out}");
        assert!(out.contains("__owned_month"), "{out}");
    }
}
