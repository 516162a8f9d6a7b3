//! Statements that name their schema: every table and function of
//! leasekeeper is written `$schema.name` in the statement text, and the
//! schema's quoted name is put in before the statement is sent.
//!
//! So no statement of the library depends on the session's `search_path`:
//! it finds leasekeeper's tables on a host's own connection (whose
//! `search_path` is the host's), inside the host's transaction, and never a
//! host table that happens to share a name (`public.tasks`), and it works
//! through a pooler that drops the `search_path` startup parameter.

use super::Schema;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{PgPool, Postgres};
use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

/// The marker for the schema in statement text.
pub const SCHEMA_MARKER: &str = "$schema";

/// Statement texts with the schema put in, per schema and template: made
/// once and kept for the life of the process, so a statement costs one map
/// look-up, and sqlx's per-connection statement cache sees the same text.
type Rendered = HashMap<String, HashMap<String, &'static str>>;
static RENDERED: LazyLock<RwLock<Rendered>> = LazyLock::new(Default::default);

impl Schema {
    /// `template` with every `$schema` replaced by this schema's quoted
    /// name: `SELECT count(*) FROM $schema.tasks` becomes
    /// `SELECT count(*) FROM "leasekeeper".tasks`.
    ///
    /// Meant for a fixed set of statements (each distinct text is kept for
    /// the life of the process), such as a service's own reads of
    /// leasekeeper's tables.
    ///
    /// ```
    /// use leasekeeper_core::db::Schema;
    ///
    /// let schema = Schema::parse("jobs").unwrap();
    /// assert_eq!(
    ///     schema.sql("SELECT id FROM $schema.tasks"),
    ///     r#"SELECT id FROM "jobs".tasks"#
    /// );
    /// ```
    pub fn sql(&self, template: &str) -> &'static str {
        if let Some(text) = RENDERED
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(self.as_str())
            .and_then(|texts| texts.get(template))
        {
            return text;
        }
        let text: &'static str = template.replace(SCHEMA_MARKER, &self.quoted()).leak();
        RENDERED
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(self.as_str().to_string())
            .or_default()
            .entry(template.to_string())
            .or_insert(text)
    }

    /// `sqlx::query` of [`Schema::sql`]`(template)`: a prepared statement
    /// reused per connection, or an unnamed one behind a transaction
    /// pooler ([`Schema::behind_transaction_pooler`]).
    pub fn query<'q>(&self, template: &str) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(self.sql(template)).persistent(!self.is_behind_transaction_pooler())
    }

    /// `sqlx::query_as` of [`Schema::sql`]`(template)`, prepared as
    /// [`Schema::query`] says.
    pub fn query_as<'q, O>(&self, template: &str) -> QueryAs<'q, Postgres, O, PgArguments>
    where
        O: for<'r> sqlx::FromRow<'r, PgRow>,
    {
        sqlx::query_as(self.sql(template)).persistent(!self.is_behind_transaction_pooler())
    }

    /// `sqlx::query_scalar` of [`Schema::sql`]`(template)`, prepared as
    /// [`Schema::query`] says.
    pub fn query_scalar<'q, O>(&self, template: &str) -> QueryScalar<'q, Postgres, O, PgArguments>
    where
        (O,): for<'r> sqlx::FromRow<'r, PgRow>,
    {
        sqlx::query_scalar(self.sql(template)).persistent(!self.is_behind_transaction_pooler())
    }

    /// The schema `pool` was built for: the `search_path` that
    /// [`super::connect_options`] (and so [`super::connect`]) put in its
    /// connect options, behind a transaction pooler if it said so, or the
    /// default schema for a pool built otherwise (a host's own). Read from
    /// the client's options, not asked of the server, so it holds behind a
    /// pooler that drops startup parameters.
    pub fn of(pool: &PgPool) -> Schema {
        let options = pool.connect_options();
        let options = options.get_options().unwrap_or_default();
        let schema = option(options, "search_path")
            .and_then(|value| Schema::parse(value.trim_matches('"')).ok())
            .unwrap_or_default();
        if option(options, POOLER_OPTION) == Some(POOLER_TRANSACTION) {
            schema.behind_transaction_pooler()
        } else {
            schema
        }
    }
}

/// The startup option that marks a pool as behind a transaction pooler
/// (a placeholder setting the server accepts and ignores; a pooler that
/// drops startup parameters never passes it on).
pub(super) const POOLER_OPTION: &str = "leasekeeper.pooler";
/// Its value for transaction mode.
pub(super) const POOLER_TRANSACTION: &str = "transaction";

/// The last value of `-c name=value` in a startup `options` string.
fn option<'a>(options: &'a str, name: &str) -> Option<&'a str> {
    options
        .split_whitespace()
        .filter_map(|word| word.strip_prefix(name)?.strip_prefix('='))
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::connect_options;
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    #[test]
    fn every_marker_gets_the_quoted_name_and_the_text_is_made_once() {
        let jobs = Schema::parse("jobs").unwrap();
        let text = "SELECT t.id FROM $schema.tasks t JOIN $schema.leases l ON true";
        assert_eq!(
            jobs.sql(text),
            r#"SELECT t.id FROM "jobs".tasks t JOIN "jobs".leases l ON true"#
        );
        assert!(std::ptr::eq(jobs.sql(text), jobs.sql(text)));
        // Two schemas, one template: two texts.
        assert_eq!(
            Schema::default().sql(text),
            r#"SELECT t.id FROM "leasekeeper".tasks t JOIN "leasekeeper".leases l ON true"#
        );
        assert_eq!(jobs.sql("SELECT now()"), "SELECT now()");
    }

    #[tokio::test]
    async fn a_pool_knows_its_schema_and_any_other_pool_means_the_default() {
        let base: PgConnectOptions = "postgres://nobody@127.0.0.1:1/none".parse().unwrap();
        let lazy = |options| PgPoolOptions::new().connect_lazy_with(options);
        let jobs = Schema::parse("svc_jobs").unwrap();
        assert_eq!(
            Schema::of(&lazy(connect_options(base.clone(), &jobs))),
            jobs
        );
        assert_eq!(Schema::of(&lazy(base.clone())), Schema::default());
        let other = base.clone().options([("statement_timeout", "5s")]);
        assert_eq!(Schema::of(&lazy(other.clone())), Schema::default());
        assert_eq!(Schema::of(&lazy(connect_options(other, &jobs))), jobs);
        let pooled = jobs.clone().behind_transaction_pooler();
        let of_pooled = Schema::of(&lazy(connect_options(base, &pooled)));
        assert_eq!(of_pooled, pooled);
        assert!(of_pooled.is_behind_transaction_pooler());
        assert!(
            !Schema::of(&lazy(connect_options(
                "postgres://nobody@127.0.0.1:1/none".parse().unwrap(),
                &jobs
            )))
            .is_behind_transaction_pooler()
        );
    }
}
