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
        #[cfg_attr(feature = "postgres", derive(::sqlx::Type))]
        #[cfg_attr(feature = "postgres", sqlx(type_name = "text"))]
        #[cfg_attr(feature = "openapi", derive(::utoipa::ToSchema))]
        $vis enum $name {
            $(
                $(#[$vmeta])*
                #[serde(rename = $text)]
                #[cfg_attr(feature = "postgres", sqlx(rename = $text))]
                $variant,
            )+
        }
        $crate::text::text_enum!(@impl $name { $($variant = $text,)+ });
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
