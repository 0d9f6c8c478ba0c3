//! The model's chat template, compiled and rendered as transformers renders it (`apply_chat_template`).
//!
//! transformers compiles a template in a sandboxed Jinja environment with `trim_blocks` and `lstrip_blocks`, the
//! loop controls, a `raise_exception` function, a `strftime_now` function and its own `tojson` (Python's
//! `json.dumps`: `", "` and `": "` separators, no HTML escaping, non-ASCII kept); MiniJinja does the same here, with
//! minijinja-contrib's Python string and dict methods (`.strip()`, `.startswith()`, `.items()`).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChatTemplate")
    }
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compile `source`; the error says what MiniJinja found wrong, with its line.
    pub fn compile(source: &str) -> Result<ChatTemplate, String> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| e.to_string())?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| describe(&e))?;
        Ok(ChatTemplate { env })
    }

    /// Render with `ctx` (`messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools`, ...).
    pub fn render(&self, ctx: Value) -> Result<String, String> {
        let t = self.env.get_template(NAME).map_err(|e| describe(&e))?;
        t.render(ctx).map_err(|e| describe(&e))
    }
}

/// An error with its line and, for a template that raised, its own message.
fn describe(e: &Error) -> String {
    let what = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    match e.line() {
        Some(line) => format!("{what} (line {line})"),
        None => what,
    }
}

/// `raise_exception(message)`: the template refuses the conversation (vLLM answers 400 with the message).
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the current UTC date and time (`%d %b %Y` in Llama 3's templates).
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `format` for the UTC time `secs` after the epoch: `%d %m %Y %y %b %B %H %M %S %j %%`; anything else is kept.
fn strftime(format: &str, secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The proleptic Gregorian date of a day number since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    // Accepted for transformers' signature; key order is kept as sent either way.
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let failed = |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, e.to_string());
    match indent.and_then(|i| i.as_usize()) {
        Some(n) => {
            let pad = vec![b' '; n];
            let f = serde_json::ser::PrettyFormatter::with_indent(&pad);
            let mut s = serde_json::Serializer::with_formatter(&mut out, f);
            serde::Serialize::serialize(&value, &mut s).map_err(failed)?;
        }
        None => {
            let mut s = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            serde::Serialize::serialize(&value, &mut s).map_err(failed)?;
        }
    }
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

/// `json.dumps`'s default separators: `", "` between items, `": "` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Render with a context parsed from JSON text (keys kept in their order, as the proxy parses bodies).
    fn render(source: &str, ctx: serde_json::Value) -> Result<String, String> {
        let ctx: Value = serde_json::from_str(&ctx.to_string()).map_err(|e| e.to_string())?;
        ChatTemplate::compile(source)?.render(ctx)
    }

    fn render_text(source: &str, ctx: &str) -> Result<String, String> {
        let ctx: Value = serde_json::from_str(ctx).map_err(|e| e.to_string())?;
        ChatTemplate::compile(source)?.render(ctx)
    }

    /// The Zephyr-style template transformers' docs use, with trim_blocks/lstrip_blocks doing the work.
    const ZEPHYR: &str = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

    #[test]
    fn system_user_and_assistant_turns_render_as_transformers_renders_them() {
        let ctx = serde_json::json!({
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Bye"},
            ],
            "add_generation_prompt": true,
            "bos_token": "<s>",
            "eos_token": "</s>",
        });
        assert_eq!(
            render(ZEPHYR, ctx).unwrap(),
            "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n<|user|>\nBye</s>\n<|assistant|>\n"
        );
    }

    #[test]
    fn python_methods_raise_exception_and_tojson_work_as_in_transformers() {
        let src = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}{{ messages[0]['content'].strip() }}|{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}";
        let ctx = |role: &str| {
            format!(
                r#"{{"messages": [{{"role": "{role}", "content": "  hé <b>  "}}],
                    "tools": [{{"name": "f", "parameters": {{"z": 1, "a": [1, 2]}}}}]}}"#
            )
        };
        assert_eq!(
            render_text(src, &ctx("user")).unwrap(),
            "hé <b>|[{\"name\": \"f\", \"parameters\": {\"z\": 1, \"a\": [1, 2]}}]|{\n  \"name\": \"f\",\n  \"parameters\": {\n    \"z\": 1,\n    \"a\": [\n      1,\n      2\n    ]\n  }\n}"
        );
        let err = render_text(src, &ctx("system")).unwrap_err();
        assert!(err.contains("Conversation roles must alternate"), "{err}");
    }

    #[test]
    fn a_template_that_does_not_compile_says_where() {
        let err = ChatTemplate::compile("{% for m in messages %}{{ m }}").unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn strftime_formats_utc_dates() {
        // 2024-07-26 13:25:09 UTC.
        assert_eq!(strftime("%d %b %Y", 1_722_000_309), "26 Jul 2024");
        assert_eq!(
            strftime("%Y-%m-%dT%H:%M:%S %B %%", 1_722_000_309),
            "2024-07-26T13:25:09 July %"
        );
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
    }
}
