//! Where a setting's value comes from (the settings file, the
//! environment, a flag; the last one set wins) and how a value is read
//! (seconds, a probability, a boolean, a count).

use super::SettingsError;
use super::keys::{ALL_KEYS, Key};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The section of `Leptos.toml` that holds the program's settings.
pub const FILE_SECTION: &str = "leasekeeper";

/// The settings file used when none is named.
pub const DEFAULT_FILE: &str = "Leptos.toml";

/// The values read from a settings file, as strings, by key.
pub(super) fn read_file_values(
    text: &str,
    origin: &Path,
) -> Result<BTreeMap<String, String>, SettingsError> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        SettingsError(format!(
            "{}: not valid TOML: {}",
            origin.display(),
            e.message()
        ))
    })?;
    let Some(section) = table.get(FILE_SECTION) else {
        return Ok(BTreeMap::new());
    };
    let section = section.as_table().ok_or_else(|| {
        SettingsError(format!(
            "{}: [{FILE_SECTION}] must be a table",
            origin.display()
        ))
    })?;
    let mut values = BTreeMap::new();
    for (key, value) in section {
        if !ALL_KEYS.iter().any(|k| k.file == key) {
            let known: Vec<_> = ALL_KEYS.iter().map(|k| k.file).collect();
            return Err(SettingsError(format!(
                "{}: unknown setting [{FILE_SECTION}].{key}; known settings: {}",
                origin.display(),
                known.join(", ")
            )));
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(SettingsError(format!(
                    "{}: [{FILE_SECTION}].{key} must be a string, number or boolean, got {}",
                    origin.display(),
                    other.type_str()
                )));
            }
        };
        values.insert(key.clone(), text);
    }
    Ok(values)
}

pub(super) struct Sources {
    pub(super) file: BTreeMap<String, String>,
}

impl Sources {
    pub(super) fn raw(&self, key: &Key, arg: &Option<String>) -> Option<String> {
        arg.clone().or_else(|| self.file.get(key.file).cloned())
    }

    pub(super) fn parse<T>(
        &self,
        key: &Key,
        arg: &Option<String>,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, SettingsError> {
        match self.raw(key, arg) {
            None => Ok(default),
            Some(raw) => parse(raw.trim())
                .map_err(|why| SettingsError(format!("{}: {raw:?} {why}", key.describe()))),
        }
    }
}

pub(super) fn seconds(raw: &str) -> Result<Duration, String> {
    let secs: f64 = raw
        .parse()
        .map_err(|_| "is not a number of seconds".to_string())?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err("must be more than 0 seconds".into());
    }
    if secs > 86_400.0 {
        return Err("must be at most 86400 seconds (one day)".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

pub(super) fn probability(raw: &str) -> Result<f64, String> {
    let p: f64 = raw.parse().map_err(|_| "is not a number".to_string())?;
    if !(0.0..=1.0).contains(&p) {
        return Err("must be between 0 and 1".into());
    }
    Ok(p)
}

pub(super) fn boolean(raw: &str) -> Result<bool, String> {
    match raw.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err("must be 0/1, true/false, on/off or yes/no".into()),
    }
}

pub(super) fn count(max: u32) -> impl Fn(&str) -> Result<u32, String> {
    move |raw| {
        let n: u32 = raw
            .parse()
            .map_err(|_| "is not a whole number".to_string())?;
        if n > max {
            return Err(format!("must be at most {max}"));
        }
        Ok(n)
    }
}

/// A token: empty means unset; otherwise 16 to 256 printable ASCII
/// characters without spaces.
pub(super) fn token(raw: &str) -> Result<Option<super::Secret>, String> {
    if raw.is_empty() {
        return Ok(None);
    }
    if raw.len() < 16 || raw.len() > 256 || raw.chars().any(|c| !c.is_ascii_graphic()) {
        return Err("must be 16 to 256 printable ASCII characters without spaces".into());
    }
    Ok(Some(super::Secret::from(raw)))
}

/// Comma-separated host names, lower-cased; a leading `.` allows every
/// subdomain. An IP address or a port is refused: addresses are always
/// answered, and a host name is matched whatever its port.
pub(super) fn host_names(raw: &str) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let name = part.to_ascii_lowercase();
        let bare = name.strip_prefix('.').unwrap_or(&name);
        let ok = !bare.is_empty()
            && bare.len() <= 253
            && bare.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            })
            && bare.parse::<std::net::IpAddr>().is_err();
        if !ok {
            return Err(format!(
                "has {part:?}, which is not a host name (letters, digits, '-' and '.', no port; a leading '.' allows subdomains)"
            ));
        }
        names.push(name);
    }
    Ok(names)
}
