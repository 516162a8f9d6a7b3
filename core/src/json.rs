//! Integers in JSON request bodies, read as JSON Schema defines them: an
//! integral number, written `184` or `184.0` (both are an `integer` to a
//! client generating or checking bodies from the OpenAPI document; serde
//! alone refuses the second). A fraction, or a value out of the field's
//! range, is still refused.

use serde::{Deserialize, Deserializer, de::Error};

/// A whole number in `T`'s range, written with or without a zero fraction.
pub fn int<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    let n = serde_json::Number::deserialize(d)?;
    let whole = match n.as_i64() {
        Some(i) => i,
        None => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 => f as i64,
            _ => return Err(D::Error::custom(format!("expected an integer, got {n}"))),
        },
    };
    T::try_from(whole).map_err(|_| D::Error::custom(format!("{whole} is out of range")))
}

/// [`int`], or `null` (and, with `#[serde(default)]`, absent).
pub fn opt_int<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    #[derive(Deserialize)]
    struct Whole(#[serde(deserialize_with = "int")] i64);
    match Option::<Whole>::deserialize(d)? {
        None => Ok(None),
        Some(Whole(i)) => T::try_from(i)
            .map(Some)
            .map_err(|_| D::Error::custom(format!("{i} is out of range"))),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Deserialize, Debug, PartialEq)]
    struct Body {
        #[serde(deserialize_with = "super::int")]
        token: i64,
        #[serde(default, deserialize_with = "super::opt_int")]
        small: Option<i16>,
    }

    fn parse(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn integral_numbers_either_way_and_nothing_else() {
        assert_eq!(
            parse(r#"{"token": 184}"#),
            Ok(Body {
                token: 184,
                small: None
            })
        );
        assert_eq!(
            parse(r#"{"token": 184.0, "small": -3.0}"#),
            Ok(Body {
                token: 184,
                small: Some(-3)
            })
        );
        assert_eq!(
            parse(r#"{"token": 1, "small": null}"#),
            Ok(Body {
                token: 1,
                small: None
            })
        );
        for bad in [
            r#"{"token": 1.5}"#,
            r#"{"token": "1"}"#,
            r#"{"token": 1e300}"#,
            r#"{"token": 1, "small": 40000}"#,
            r#"{"token": 1, "small": 0.5}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}

/// The largest magnitude of a number [`storable`] takes.
pub const MAX_NUMBER: f64 = 1e300;

/// Whether `value` reads back as it was written once stored as `jsonb`
/// (numbers within ±[`MAX_NUMBER`]):
/// PostgreSQL keeps a number exactly, as decimal digits (`1.7976931348623157e308`
/// becomes 17976931348623157 and 292 zeros), and a number that close to
/// `f64`'s limit does not parse as an `f64` again, so the row could be
/// written but never read. Also refuses NUL, which `jsonb` cannot hold.
/// `field` names the value in the error.
pub fn storable(value: &serde_json::Value, field: &str) -> Result<(), String> {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            // One plain limit a client can know (and an OpenAPI document can
            // say): beyond it lies the edge where a stored number may not
            // read back.
            if n.as_f64().is_some_and(|f| f.abs() > MAX_NUMBER) {
                return Err(format!(
                    "{field} holds the number {n}, beyond ±1e300, the largest stored"
                ));
            }
            let stored = as_postgres_prints(&n.to_string());
            if serde_json::from_str::<serde_json::Number>(&stored).is_err() {
                return Err(format!(
                    "{field} holds the number {n}, too close to the largest a JSON reader takes"
                ));
            }
            Ok(())
        }
        Value::String(s) if s.contains('\0') => {
            Err(format!("{field} must not contain the NUL character"))
        }
        Value::Array(items) => items.iter().try_for_each(|v| storable(v, field)),
        Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            if k.contains('\0') {
                return Err(format!("{field} must not contain the NUL character"));
            }
            storable(v, field)
        }),
        _ => Ok(()),
    }
}

/// `value` as it reads back once stored as `jsonb` (a [`storable`] value):
/// the same but for numbers written with an exponent, which PostgreSQL
/// keeps as plain digits (`1e16` reads back as the integer
/// `10000000000000000`). What an insert answers without reading its rows
/// back is then what a later read gives.
pub fn as_stored(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let printed = n.to_string();
            if printed.contains(['e', 'E']) {
                serde_json::from_str(&as_postgres_prints(&printed))
                    .unwrap_or_else(|_| value.clone())
            } else {
                value.clone()
            }
        }
        Value::Array(items) => Value::Array(items.iter().map(as_stored).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), as_stored(v))).collect())
        }
        _ => value.clone(),
    }
}

/// `number` (as serde_json writes it, maybe with an exponent) written out
/// in plain digits, as PostgreSQL's `numeric` prints it.
fn as_postgres_prints(number: &str) -> String {
    let Some((mantissa, exp)) = number.split_once(['e', 'E']) else {
        return number.to_string();
    };
    let Ok(exp) = exp.parse::<i32>() else {
        return number.to_string();
    };
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let point = int.len() as i32 + exp;
    if point >= digits.len() as i32 {
        format!(
            "{sign}{digits}{}",
            "0".repeat((point - digits.len() as i32) as usize)
        )
    } else if point <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
    } else {
        let (a, b) = digits.split_at(point as usize);
        format!("{sign}{a}.{b}")
    }
}

#[cfg(test)]
mod storable_tests {
    use super::{as_postgres_prints, storable};
    use serde_json::json;

    #[test]
    fn plain_digits_as_postgres_prints_them() {
        assert_eq!(as_postgres_prints("1.5e3"), "1500");
        assert_eq!(as_postgres_prints("-2.5e-3"), "-0.0025");
        assert_eq!(as_postgres_prints("42"), "42");
        assert_eq!(as_postgres_prints("1e2"), "100");
    }

    #[test]
    fn what_reads_back_is_storable_and_the_rest_is_refused() {
        assert!(storable(&json!({"a": [1, 2.5, -3e30, "x", null, true]}), "d").is_ok());
        assert!(storable(&json!({"big": 1.0e300}), "d").is_ok());
        assert!(storable(&json!({"big": -1.0000000000000002e300}), "d").is_err());
        let edge = serde_json::from_str(r#"{"x": [-1.7976931348623157e308]}"#).unwrap();
        let err = storable(&edge, "task_data").unwrap_err();
        assert!(err.contains("task_data"), "{err}");
        assert!(storable(&json!({"s": "a\u{0}b"}), "d").is_err());
        assert!(storable(&json!({"a\u{0}": 1}), "d").is_err());
    }

    #[test]
    fn as_stored_writes_exponents_out_and_keeps_the_rest() {
        let v = json!({"big": 1e16, "small": 2.5e-7, "n": [1, 2.5, "x"], "o": {"z": 3e20}});
        let stored = super::as_stored(&v);
        assert_eq!(stored["big"], json!(10_000_000_000_000_000_u64));
        assert_eq!(stored["small"].as_f64(), Some(2.5e-7));
        assert_eq!(stored["n"], json!([1, 2.5, "x"]));
        assert_eq!(stored["o"]["z"].as_f64(), Some(3e20));
    }
}

/// The name of the OpenAPI component schema of JSON that `jsonb` stores
/// and gives back ([`storable`]): no NUL character in a string or a key at
/// any depth, and numbers within ±[`MAX_NUMBER`]. Recursive, so a
/// generator of test data keeps to it at every depth. The document adds
/// the component ([`storable_json`] with `null`); the fields that take
/// such JSON refer to it.
#[cfg(feature = "openapi")]
pub const STORABLE_JSON: &str = "StorableJson";

/// [`STORABLE_JSON`]'s shapes, `null` among them when `null_too`; nested
/// values refer to the component.
#[cfg(feature = "openapi")]
pub fn storable_json(null_too: bool) -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
    use utoipa::openapi::schema::{
        AdditionalProperties, AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, Type,
    };
    use utoipa::openapi::{Ref, RefOr};
    let nested = || Ref::from_schema_name(STORABLE_JSON);
    let no_nul = "^[^\\x00]*$";
    let mut any = AnyOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property_names(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some(no_nul)),
                ))
                .additional_properties(Some(AdditionalProperties::RefOr(RefOr::Ref(nested())))),
        )
        .item(ArrayBuilder::new().items(RefOr::Ref(nested())))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(no_nul)),
        )
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .minimum(Some(-MAX_NUMBER))
                .maximum(Some(MAX_NUMBER)),
        )
        .item(ObjectBuilder::new().schema_type(Type::Boolean));
    if null_too {
        any = any.item(ObjectBuilder::new().schema_type(Type::Null));
    }
    RefOr::T(Schema::AnyOf(any.build()))
}

/// Any JSON value but `null` that `jsonb` stores and gives back, for a
/// field's schema: [`STORABLE_JSON`] without null at the top.
#[cfg(feature = "openapi")]
pub fn any_but_null() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
    storable_json(false)
}
