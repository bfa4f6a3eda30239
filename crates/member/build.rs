//! Builds the guarded-access shim (csrc/guard.c, see src/guard.rs).

fn main() {
    println!("cargo:rerun-if-changed=csrc/guard.c");
    cc::Build::new()
        .file("csrc/guard.c")
        .warnings(true)
        .compile("raidkit_guard");
}
