//! `expose_paths` (top level and per pool): engine paths beyond the inference API that the client port forwards.

use serde_norway::Value;

use super::walk::Field;
use super::ConfigError;
use crate::paths::check_exposable;

/// A list of plain paths, normalised; absent or empty = nothing beyond the inference API.
pub(super) fn expose_paths(f: &Field<'_>) -> Result<Vec<String>, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => return Err(f.type_err("a list of paths such as [\"/metrics\"]", other)),
    };
    let mut out: Vec<String> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let path = check_exposable(item.string()?.trim()).map_err(|r| item.err(r))?;
        if out.contains(&path) {
            return Err(item.err(format!("`{path}` is listed twice")));
        }
        out.push(path);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::testing::*;

    #[test]
    fn top_level_and_pool_lists() {
        let c = parse(POOL).unwrap();
        assert!(c.expose_paths.is_empty());
        assert!(c.pools[0].expose_paths.is_empty());
        let c = parse(&format!(
            "expose_paths: [/metrics, \"/v1/load_lora_adapter/\"]\n{}",
            pool_with("    expose_paths: [/sleep, /wake_up]\n")
        ))
        .unwrap();
        assert_eq!(c.expose_paths, ["/metrics", "/v1/load_lora_adapter"]);
        assert_eq!(c.pools[0].expose_paths, ["/sleep", "/wake_up"]);
        assert!(parse(&format!("expose_paths: []\n{POOL}")).is_ok());
    }

    #[test]
    fn bad_entries_name_their_item() {
        assert_err(
            &format!("expose_paths: [/metrics, metrics]\n{POOL}"),
            "expose_paths[1]",
            &["starting with `/`"],
        );
        assert_err(
            &format!("expose_paths: [/metrics, /metrics/]\n{POOL}"),
            "expose_paths[1]",
            &["`/metrics` is listed twice"],
        );
        assert_err(
            &format!("expose_paths: /metrics\n{POOL}"),
            "expose_paths",
            &["expected a list of paths"],
        );
        assert_err(
            &pool_with("    expose_paths: [/health]\n"),
            "pools[0].expose_paths[0]",
            &["answered by the router"],
        );
        assert_err(
            &pool_with("    expose_paths: [/v1/completions]\n"),
            "pools[0].expose_paths[0]",
            &["always served"],
        );
        assert_err(
            &format!("expose_paths: [\"/a/../metrics\"]\n{POOL}"),
            "expose_paths[0]",
            &["`..` segments"],
        );
    }
}
