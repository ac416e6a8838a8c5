//! Export macros of `weir-guest`.
//!
//! A component implements exactly one world, so its export bindings must be generated in
//! the operator's own crate. These macros expand to one `wit_bindgen::generate!` for the
//! `paged-operator` or `paged-co-operator` world of `wit/operator.wit` (found through this crate's
//! location) that reuses the SDK's import bindings, plus a `Guest` impl that forwards each
//! export to the SDK's driver.

use proc_macro::TokenStream;

const WIT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../wit");

fn expand(ty: TokenStream, world: &str, process: &str) -> TokenStream {
    let ty = ty.to_string();
    if ty.trim().is_empty() {
        return r#"compile_error!("name the operator type: export_operator!(MyOperator)");"#.parse().unwrap();
    }
    let wit = format!("{WIT_DIR:?}");
    let code = format!(
        r#"
#[doc(hidden)]
type __WeirExportedOperator = {ty};

#[doc(hidden)]
mod __weir_export {{
    ::weir_guest::__private::wit_bindgen::generate!({{
        path: {wit},
        world: "{world}",
        runtime_path: "::weir_guest::__private::wit_bindgen::rt",
        with: {{
            "weir:operator/types@0.3.2": ::weir_guest::__private::bindings::types,
            "weir:operator/context@0.3.2": ::weir_guest::__private::bindings::context,
            "weir:operator/collector@0.3.2": ::weir_guest::__private::bindings::collector,
            "weir:operator/timers@0.3.2": ::weir_guest::__private::bindings::timers,
            "weir:operator/logging@0.3.2": ::weir_guest::__private::bindings::logging,
        }},
    }});

    use ::weir_guest::__private::bindings::types;
    use ::weir_guest::__private::driver;

    type Op = super::__WeirExportedOperator;
    static SLOT: ::weir_guest::__private::Slot<Op> = ::weir_guest::__private::Slot::new();

    struct Export;

    impl Guest for Export {{
        fn describe() -> types::OperatorInfo {{
            driver::describe::<Op>()
        }}
        fn setup(config: ::std::vec::Vec<(::std::string::String, ::std::string::String)>) -> ::core::result::Result<(), ::std::string::String> {{
            driver::open(&SLOT, config)
        }}
        {process}
        fn on_timer(domain: types::TimeDomain, timers: ::std::vec::Vec<u8>) -> ::core::result::Result<(), ::std::string::String> {{
            driver::on_timer(&SLOT, domain, timers)
        }}
        fn on_watermark(watermark: i64) -> ::core::result::Result<(), ::std::string::String> {{
            driver::on_watermark(&SLOT, watermark)
        }}
        fn snapshot(checkpoint_id: u64, mode: types::SnapshotMode) -> ::core::result::Result<types::OperatorSnapshot, ::std::string::String> {{
            driver::snapshot(&SLOT, checkpoint_id, mode)
        }}
        fn restore(schema_version: u32, state: types::OperatorSnapshot) -> ::core::result::Result<(), ::std::string::String> {{
            driver::restore(&SLOT, schema_version, state)
        }}
        fn finish() -> ::core::result::Result<(), ::std::string::String> {{
            driver::close(&SLOT)
        }}
        fn query_state(state: ::std::string::String, key_group: u32, key: ::std::vec::Vec<u8>) -> ::core::result::Result<::core::option::Option<::std::string::String>, ::std::string::String> {{
            driver::query_state(&SLOT, &state, key_group, &key)
        }}
        fn page_in(state: ::std::vec::Vec<types::KeyGroupState>) -> ::core::result::Result<(), ::std::string::String> {{
            driver::page_in(&SLOT, state)
        }}
        fn page_out(evict: ::std::vec::Vec<u8>, evict_all: bool) -> ::core::result::Result<::std::vec::Vec<types::KeyGroupState>, ::std::string::String> {{
            driver::page_out(&SLOT, &evict, evict_all)
        }}
    }}

    export!(Export);
}}
"#
    );
    code.parse().expect("weir-guest-macros generated invalid tokens")
}

/// Exports a one-input [`Operator`] type as the component's `paged-operator` world.
///
/// ```text
/// weir_guest::export_operator!(Counter);
/// ```
#[proc_macro]
pub fn export_operator(input: TokenStream) -> TokenStream {
    expand(
        input,
        "paged-operator",
        r#"fn process(batch: ::std::vec::Vec<u8>) -> ::core::result::Result<(), ::std::string::String> {
            driver::process(&SLOT, batch)
        }"#,
    )
}

/// Exports a two-input operator (`Operator` + `CoOperator`) as the `paged-co-operator` world.
#[proc_macro]
pub fn export_co_operator(input: TokenStream) -> TokenStream {
    expand(
        input,
        "paged-co-operator",
        r#"fn process_left(batch: ::std::vec::Vec<u8>) -> ::core::result::Result<(), ::std::string::String> {
            driver::process(&SLOT, batch)
        }
        fn process_right(batch: ::std::vec::Vec<u8>) -> ::core::result::Result<(), ::std::string::String> {
            driver::process_right(&SLOT, batch)
        }"#,
    )
}
