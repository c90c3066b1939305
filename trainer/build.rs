//! With the `torch` feature: compiles the C++ shim (csrc/: `shim.cpp` autocast, TF32, pinned
//! batches, side-stream copies, clipping; `ddp.cpp` c10d process groups and the Reducer;
//! `checkpoint.cpp` torch.save-format state dicts) against the libtorch torch-sys found, adds
//! an rpath to it for this crate's test binaries, and passes the directory on to the `app`
//! package (`DEP_TRAINER_LIBTORCH_LIB`) and to the code (`TRAINER_LIBTORCH_LIB`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "torch")]
    torch::build();
}

#[cfg(feature = "torch")]
mod torch {
    use std::path::PathBuf;

    pub fn build() {
        let files = ["csrc/shim.cpp", "csrc/ddp.cpp", "csrc/checkpoint.cpp"];
        println!("cargo:rerun-if-changed=csrc/shim.h");
        for file in files {
            println!("cargo:rerun-if-changed={file}");
        }
        // torch-sys (`links = "tch"`) exports the directory it linked against.
        let lib = PathBuf::from(std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"));
        let root = lib.parent().expect("libtorch lib/ has a parent").to_path_buf();
        cc::Build::new()
            .cpp(true)
            .pic(true)
            .warnings(false)
            .include(root.join("include"))
            .include(root.join("include/torch/csrc/api/include"))
            .flag("-std=c++17")
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            .flag("-DGLOG_USE_GLOG_EXPORT")
            .files(files)
            .compile("trainer_shim");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        println!("cargo:rustc-env=TRAINER_LIBTORCH_LIB={}", lib.display());
        println!("cargo:libtorch_lib={}", lib.display());
    }
}
