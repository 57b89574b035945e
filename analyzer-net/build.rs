//! Generates the tonic client and server of the `Analyzer` service of
//! `../ccld-wire/proto/ccld.proto`. The messages are not generated again: `extern_path`
//! points every `ccld.v1` type at the `ccld-wire` crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../ccld-wire/proto/ccld.proto");
    let fds = protox::compile(["ccld.proto"], ["../ccld-wire/proto"])?;
    tonic_prost_build::configure()
        // The transport-specific `connect` helper needs tonic's `transport` feature; the
        // service builds clients with `AnalyzerClient::new(channel)` instead.
        .build_transport(false)
        .extern_path(".ccld.v1", "::ccld_wire")
        .compile_fds(fds)?;
    Ok(())
}
