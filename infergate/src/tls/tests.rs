use super::testing::{self_signed, write_pem};
use super::*;

#[test]
fn a_matching_pair_loads_and_shows_its_fingerprint_not_its_key() {
    let (cert, key) = self_signed("router.test");
    let (c, k) = write_pem("pair", &cert, &key);
    let l = load_cert(&c, &k).unwrap();
    assert_eq!(l.info.sha256.len(), 64);
    assert!(l.info.subject.contains("router.test"), "{}", l.info.subject);
    assert!(l.info.not_after > 1_700_000_000, "{}", l.info.not_after);
    let shown = format!("{:?} {}", l.info, l.info);
    assert!(shown.starts_with("sha256:"), "{shown}");
    assert!(!shown.contains("PRIVATE"), "{shown}");
}

#[test]
fn every_bad_file_is_named_with_its_reason() {
    let (cert, key) = self_signed("a.test");
    let (_, other_key) = self_signed("b.test");
    let (c, k) = write_pem("bad-a", &cert, &key);
    let (_, k2) = write_pem("bad-b", &cert, &other_key);
    let e = load_cert(&c, &k2).unwrap_err();
    assert!(
        e.contains("does not belong") && e.contains(&k2.display().to_string()),
        "{e}"
    );
    let e = load_cert(Path::new("/nonexistent.pem"), &k).unwrap_err();
    assert!(e.starts_with("cannot read `/nonexistent.pem`: "), "{e}");
    let e = read_certs(&k).unwrap_err();
    assert!(e.contains("no certificate"), "{e}");
    let e = read_key(&c).unwrap_err();
    assert!(e.contains("no private key"), "{e}");
    let e = read_ca(&k).unwrap_err();
    assert!(e.contains("no certificate"), "{e}");
    assert_eq!(read_ca(&c).unwrap().len(), 1);
    // A chain without a certificate is refused, naming its file (never indexed into).
    let e = pair(&c, Vec::new(), &k, read_key(&k).unwrap()).unwrap_err();
    assert!(
        e.contains("no certificate") && e.contains(&c.display().to_string()),
        "{e}"
    );
}

#[test]
fn the_server_certificate_swaps_for_new_handshakes() {
    let (c1, k1) = self_signed("one.test");
    let (c2, k2) = self_signed("two.test");
    let (c1, k1) = write_pem("swap-1", &c1, &k1);
    let (c2, k2) = write_pem("swap-2", &c2, &k2);
    let (one, two) = (load_cert(&c1, &k1).unwrap(), load_cert(&c2, &k2).unwrap());
    let sc = ServerCert::new(&one);
    assert!(sc.serves(&one));
    // Read again: the same certificate.
    assert!(sc.serves(&load_cert(&c1, &k1).unwrap()));
    sc.set(&two);
    assert!(sc.serves(&two) && !sc.serves(&one));
}

#[test]
fn an_expired_or_expiring_certificate_is_warned_about() {
    let info = CertInfo {
        sha256: "AB".repeat(32),
        subject: "CN=x".into(),
        not_after: 1_000_000,
    };
    assert!(info
        .expiry_warning(1_000_000)
        .unwrap()
        .contains("has expired"));
    let soon = info.expiry_warning(1_000_000 - 3 * 86_400).unwrap();
    assert!(soon.contains("expires in 72 hours"), "{soon}");
    assert_eq!(info.expiry_warning(1_000_000 - 30 * 86_400), None);
}
