//! When the workspace is built with `--features torch`, `app`'s library links libtorch into
//! `app-bench` too: the same rpath as `app` (../build.rs) lets it and its tests find it.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Set by the trainer's build script only when it built against libtorch.
    if let Ok(lib) = std::env::var("DEP_TRAINER_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
