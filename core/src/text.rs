//! Enums that are names: each variant has one text, written once.
//!
//! `text_enum!` declares a field-less enum whose variants are written
//! `Variant = "text"` and gives it `ALL` (every variant, in declaration
//! order), `as_str` and `parse` (the inverse of `as_str`), with `Clone, Copy,
//! Debug, PartialEq, Eq, Hash` derived. Other attributes pass through.
//!
//! With `stored;` first, the enum is also part of the wire contract and of
//! the tables: serde, `sqlx::Type` (as `text`, under `postgres`) and
//! `utoipa::ToSchema` (under `openapi`) are derived, each variant renamed to
//! its text, so JSON, the database and the dashboard say the same word. This
//! is crates.io's `pg_enum!` idea for text columns.

/// See the [module docs](self).
macro_rules! text_enum {
    (
        stored;
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ::serde::Serialize, ::serde::Deserialize)]
        #[cfg_attr(feature = "openapi", derive(::utoipa::ToSchema))]
        // The texts are the variants' names in snake_case (a test checks):
        // said once more for the OpenAPI document, which does not read the
        // per-variant renames a macro writes.
        #[serde(rename_all = "snake_case")]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $text)]
                $variant,
            )+
        }
        $crate::text::text_enum!(@impl $name { $($variant = $text,)+ });
        $crate::text::text_enum!(@sql $name);
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }
        $crate::text::text_enum!(@impl $name { $($variant = $text,)+ });
    };
    // As `text` by its OID, like `&str`: sqlx's derive names the type
    // `text` and looks its OID up by name once per connection, with a
    // statement it prepares by name (which a pooler in transaction mode
    // leaves behind on a server connection another client then collides
    // with).
    (@sql $name:ident) => {
        #[cfg(feature = "postgres")]
        impl ::sqlx::Type<::sqlx::Postgres> for $name {
            fn type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &::sqlx::postgres::PgTypeInfo) -> bool {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::compatible(ty)
            }
        }

        #[cfg(feature = "postgres")]
        impl ::sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        #[cfg(feature = "postgres")]
        impl<'q> ::sqlx::Encode<'q, ::sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut ::sqlx::postgres::PgArgumentBuffer,
            ) -> Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                <&str as ::sqlx::Encode<'q, ::sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }

        #[cfg(feature = "postgres")]
        impl<'r> ::sqlx::Decode<'r, ::sqlx::Postgres> for $name {
            fn decode(
                value: ::sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, ::sqlx::error::BoxDynError> {
                let text = <&str as ::sqlx::Decode<'r, ::sqlx::Postgres>>::decode(value)?;
                $name::parse(text).ok_or_else(|| {
                    format!("{:?} is not a {}", text, stringify!($name)).into()
                })
            }
        }
    };
    (@impl $name:ident { $($variant:ident = $text:literal,)+ }) => {
        impl $name {
            /// Every value, in declaration order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The value's name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value [`as_str`](Self::as_str) names; `None` for any other text.
            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

pub(crate) use text_enum;

#[cfg(test)]
mod tests {
    text_enum! {
        /// A test enum.
        enum Colour {
            Red = "red",
            DarkBlue = "dark_blue",
        }
    }

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        for c in Colour::ALL {
            assert_eq!(Colour::parse(c.as_str()), Some(c));
        }
        assert_eq!(Colour::DarkBlue.as_str(), "dark_blue");
        assert_eq!(Colour::parse("Red"), None);
        assert_eq!(Colour::parse(""), None);
    }
}
