//! Test guest: a valid component of a different world (it exports `process` with another
//! signature and nothing else), which the host must refuse with a clear error.

wit_bindgen::generate!({
    inline: r#"
        package test:wrong@0.1.0;
        world wrong {
            export process: func(records: list<string>) -> u32;
        }
    "#,
    world: "wrong",
});

struct Wrong;

impl Guest for Wrong {
    fn process(records: Vec<String>) -> u32 {
        records.len() as u32
    }
}

export!(Wrong);
