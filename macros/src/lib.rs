//! The `#[cached]` attribute of [stampede-guard](https://docs.rs/stampede-guard). Use it through
//! the main crate's `macros` feature, as `stampede_guard::cached`; its documentation, with the
//! syntax, the error contract and examples, is there.
//!
//! The expansion is one call of `stampede_guard::__cached::run` (the cache, the key, the TTL,
//! the options, the body as a future, and the error type's text and `From`), so `cargo expand`
//! shows a few lines per function.
#![deny(missing_docs, missing_debug_implementations)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod args;
mod expand;
mod template;

use proc_macro::TokenStream;

/// Caches an async function's `Ok` value through a `stampede_guard::Cache`: one execution of
/// its body per key across the fleet. Documented at `stampede_guard::cached`, which re-exports
/// it.
#[proc_macro_attribute]
pub fn cached(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut parsed = args::Args::default();
    let parser = syn::meta::parser(|meta| parsed.one(meta));
    syn::parse_macro_input!(args with parser);
    let function = syn::parse_macro_input!(item as syn::ItemFn);
    expand::expand(parsed, function)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
