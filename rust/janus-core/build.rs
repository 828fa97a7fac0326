//! Builds the thin C shim over ACL (dlopen'ed at run time; no link-time dependency).
fn main() {
    println!("cargo:rerun-if-changed=csrc/acl_shim.c");
    cc::Build::new().file("csrc/acl_shim.c").warnings(true).compile("janus_acl_shim");
    println!("cargo:rustc-link-lib=dl");
}
