//! With the `torch` feature, `app` and its test binaries find libtorch through an rpath to the
//! directory the trainer was built against (no LD_LIBRARY_PATH needed, also for the `app train`
//! a worker spawns).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() {
        let lib =
            std::env::var("DEP_TRAINER_LIBTORCH_LIB").expect("the trainer crate exports DEP_TRAINER_LIBTORCH_LIB");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
