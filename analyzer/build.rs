//! Compiles `proto/ccld.proto` without a system `protoc`: `protox` parses it into a
//! FileDescriptorSet (pure Rust) and `tonic-prost-build` generates the prost messages and
//! the tonic client/server for the `Analyzer` service into OUT_DIR.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/ccld.proto");
    let fds = protox::compile(["ccld.proto"], ["proto"])?;
    tonic_prost_build::configure()
        // The transport-specific `connect` helper needs tonic's `transport` feature; the
        // service crate builds clients with `AnalyzerClient::new(channel)` instead.
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
