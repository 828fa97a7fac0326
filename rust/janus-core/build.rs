//! Builds the thin C shim over ACL (dlopen'ed at run time; no link-time dependency).
fn main() {
    println!("cargo:rerun-if-changed=csrc");
}
