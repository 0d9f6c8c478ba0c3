//! `route_receipt` (top level): which clients get the `x-infergate-route` header, the router's account of where
//! their request went and why.

use serde_norway::Value;

use super::auth::AuthConfig;
use super::walk::Field;
use super::ConfigError;

/// Who gets the route receipt on proxied answers. It names an engine address, a pool and how loaded the router
/// thought it was: information for the operator's own clients, so off unless the file says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RouteReceipt {
    /// Nobody (the default).
    #[default]
    Off,
    /// Every client (`true`): where every client is trusted, or every key of `auth` is.
    All,
    /// These client keys of `auth` (names, as in the keys file).
    Keys(Vec<String>),
}

impl RouteReceipt {
    /// Whether a request admitted under the client key `key` (its name; None without `auth`) gets the receipt.
    pub fn for_key(&self, key: Option<&str>) -> bool {
        match self {
            RouteReceipt::Off => false,
            RouteReceipt::All => true,
            RouteReceipt::Keys(names) => key.is_some_and(|k| names.iter().any(|n| n == k)),
        }
    }
}

/// `route_receipt`: `false` (default), `true`, or a list of client key names (which needs `auth`, and each name
/// must be one of its keys).
pub(super) fn route_receipt(
    f: &Field<'_>,
    auth: Option<&AuthConfig>,
) -> Result<RouteReceipt, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) | Some(Value::Bool(false)) => return Ok(RouteReceipt::Off),
        Some(Value::Bool(true)) => return Ok(RouteReceipt::All),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => {
            return Err(f.type_err(
                "true, false, or a list of client key names such as [alice, ci]",
                other,
            ))
        }
    };
    let Some(auth) = auth else {
        return Err(f.err(
            "a list of client keys needs the `auth` section; without it write `true` (every client) or `false`",
        ));
    };
    let mut names: Vec<String> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let name = item.string()?.trim().to_string();
        if !auth.keys.iter().any(|k| k.name == name) {
            return Err(item.err(format!("no key named `{name}` in {}", auth.source)));
        }
        if names.contains(&name) {
            return Err(item.err(format!("`{name}` is listed twice")));
        }
        names.push(name);
    }
    Ok(RouteReceipt::Keys(names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    const K1: &str = "sk-alice-0123456789abcdef";
    const K2: &str = "sk-batch-0123456789abcdef";

    #[test]
    fn off_by_default_all_or_named_keys() {
        assert_eq!(parse(POOL).unwrap().route_receipt, RouteReceipt::Off);
        let c = parse(&format!("route_receipt: true\n{POOL}")).unwrap();
        assert_eq!(c.route_receipt, RouteReceipt::All);
        assert!(c.route_receipt.for_key(None));
        let f = temp_file("receipt-keys", &format!("alice:{K1}\nbatch:{K2}\n"));
        let c = parse(&format!(
            "auth: {{ keys_file: {} }}\nroute_receipt: [alice]\n{POOL}",
            f.display()
        ))
        .unwrap();
        let r = c.route_receipt;
        assert_eq!(r, RouteReceipt::Keys(vec!["alice".into()]));
        assert!(r.for_key(Some("alice")));
        assert!(!r.for_key(Some("batch")));
        assert!(!r.for_key(None));
        assert!(!RouteReceipt::Off.for_key(Some("alice")));
        let _ = std::fs::remove_file(f);
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_err(
            &format!("route_receipt: [alice]\n{POOL}"),
            "route_receipt",
            &["needs the `auth` section"],
        );
        assert_err(
            &format!("route_receipt: yes please\n{POOL}"),
            "route_receipt",
            &["expected true, false, or a list of client key names"],
        );
        let f = temp_file("receipt-bad", &format!("alice:{K1}\n"));
        let with = |list: &str| {
            format!(
                "auth: {{ keys_file: {} }}\nroute_receipt: {list}\n{POOL}",
                f.display()
            )
        };
        assert_err(
            &with("[alice, zed]"),
            "route_receipt[1]",
            &["no key named `zed`"],
        );
        assert_err(
            &with("[alice, alice]"),
            "route_receipt[1]",
            &["listed twice"],
        );
        let _ = std::fs::remove_file(f);
    }
}
