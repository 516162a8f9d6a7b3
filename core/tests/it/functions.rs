//! Each SQL function defined once: its current body is its file in
//! `migrations/functions/`, the database runs exactly that, every function
//! of the schema has a file, and no new versioned migration writes a
//! function's text again.

use crate::common::TestDb;
use leasekeeper_core::db::{FUNCTIONS, Schema, migrate};
use sqlx::{Connection, PgConnection};
use std::path::{Path, PathBuf};

/// The newest versioned migration when the function files were introduced:
/// migrations up to it hold earlier texts of the functions and cannot
/// change; a newer one must not define a function (its file does).
const CUT_OFF: u64 = 20261204000001;

fn migrations_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations")
}

/// The names of the `.sql` files in `migrations/functions/`, sorted.
fn function_files_on_disk() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(migrations_dir().join("functions"))
        .expect("migrations/functions/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "sql"))
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Every function of the default schema and its definition as the server
/// prints it, by signature.
async fn definitions(conn: &mut PgConnection) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)
           FROM pg_proc p WHERE p.pronamespace = 'leasekeeper'::regnamespace
          ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .unwrap()
}

/// (a) Each file is what the migrated database runs: applying it again, as
/// the migrator does (the schema alone on the search_path), changes no
/// function's definition, arguments, settings (the pinned search_path
/// included) or body, and adds none.
#[tokio::test]
async fn every_function_file_is_what_a_migrated_database_runs() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SELECT set_config('search_path', $1, true)")
        .bind(Schema::default().quoted())
        .execute(&mut *tx)
        .await
        .unwrap();
    let migrated = definitions(&mut tx).await;
    let mut differ = Vec::new();
    for file in FUNCTIONS {
        let creates = file.sql.matches("CREATE OR REPLACE FUNCTION").count();
        assert_eq!(
            creates, 1,
            "{}.sql: one CREATE OR REPLACE FUNCTION per file",
            file.name
        );
        assert!(
            file.sql
                .contains(&format!("CREATE OR REPLACE FUNCTION {}(", file.name)),
            "{}.sql defines another function than its name says",
            file.name
        );
        sqlx::query("SAVEPOINT a_file")
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::raw_sql(file.sql)
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{}.sql: {e}", file.name));
        let after = definitions(&mut tx).await;
        if after != migrated {
            let changed: Vec<&String> = after
                .iter()
                .filter(|d| !migrated.contains(d))
                .map(|(signature, _)| signature)
                .collect();
            differ.push(format!("{}.sql (differs: {changed:?})", file.name));
        }
        sqlx::query("ROLLBACK TO SAVEPOINT a_file")
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.rollback().await.unwrap();
    assert!(
        differ.is_empty(),
        "the migrated database does not run these files: {differ:?}"
    );
}

/// (b) Every function of the schema has its file (none is defined only in a
/// versioned migration), every file is applied (in `FUNCTIONS`), and no
/// name has two signatures.
#[tokio::test]
async fn every_function_of_the_schema_has_its_file() {
    let db = TestDb::new().await;
    let mut in_schema: Vec<String> = sqlx::query_scalar(
        "SELECT proname::text FROM pg_proc WHERE pronamespace = 'leasekeeper'::regnamespace",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    in_schema.sort();
    let on_disk = function_files_on_disk();
    assert_eq!(
        in_schema, on_disk,
        "the schema's functions (left) and migrations/functions/*.sql (right)"
    );
    let mut listed: Vec<String> = FUNCTIONS.iter().map(|f| f.name.to_string()).collect();
    listed.sort();
    assert_eq!(
        listed, on_disk,
        "db::FUNCTIONS (left) and migrations/functions/*.sql (right)"
    );
}

/// The `CREATE [OR REPLACE] FUNCTION` statements of a migration's text,
/// except the placeholder a migration may create for a new trigger
/// function its trigger needs (`BEGIN RETURN NULL; END` as the body).
fn function_definitions(sql: &str) -> Vec<String> {
    let words: Vec<&str> = sql.split_whitespace().collect();
    let upper: Vec<String> = words.iter().map(|w| w.to_uppercase()).collect();
    let mut found = Vec::new();
    for i in 0..upper.len() {
        let replace = upper[i..].starts_with(&["CREATE".into(), "OR".into(), "REPLACE".into()]);
        let rest = if replace { i + 3 } else { i + 1 };
        if upper[i] != "CREATE" || upper.get(rest).is_none_or(|w| w != "FUNCTION") {
            continue;
        }
        // Named by its words up to its arguments' closing parenthesis.
        let text = words[i..].join(" ");
        let statement = text[..text.find(')').map_or(text.len(), |end| end + 1)].to_string();
        // The body: between the first two `$$` after the name.
        let body: Option<String> = text
            .split("$$")
            .nth(1)
            .map(|b| b.split_whitespace().collect::<Vec<_>>().join(" "));
        let placeholder = !replace
            && matches!(
                body.as_deref(),
                Some("BEGIN RETURN NULL; END;" | "BEGIN RETURN NULL; END")
            );
        if !placeholder {
            found.push(statement);
        }
    }
    found
}

/// (c) No versioned migration newer than the cut-off defines a function:
/// a function's body is changed in its file, so that a reader finds it in
/// one place.
#[test]
fn no_versioned_migration_after_the_cut_off_defines_a_function() {
    let mut offending = Vec::new();
    for entry in std::fs::read_dir(migrations_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(version) = name.split('_').next().and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        if !path.is_file() || version <= CUT_OFF {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for statement in function_definitions(&text) {
            offending.push(format!("{name}: {statement}"));
        }
    }
    assert!(
        offending.is_empty(),
        "a versioned migration defines a function; edit (or add) its file in \
         core/migrations/functions/ instead (see its README):\n{}",
        offending.join("\n")
    );
}

/// The scan above finds what it must, and lets the placeholder pass.
#[test]
fn the_function_definition_scan_finds_definitions() {
    assert_eq!(
        function_definitions(
            "ALTER TABLE tasks ADD COLUMN x int;\n\
             create or replace function task_counts_move() returns trigger\n\
             LANGUAGE plpgsql AS $$ BEGIN UPDATE task_counts SET x = 1; RETURN NULL; END; $$;\n\
             CREATE FUNCTION helper(a int) RETURNS int LANGUAGE sql AS $$ SELECT a $$;"
        ),
        vec![
            "create or replace function task_counts_move()",
            "CREATE FUNCTION helper(a int)",
        ]
    );
    assert_eq!(
        function_definitions(
            "CREATE FUNCTION tasks_new_thing() RETURNS trigger LANGUAGE plpgsql\n\
             SET search_path FROM CURRENT AS $$\n BEGIN\n RETURN NULL;\n END\n $$;\n\
             CREATE TRIGGER tasks_new_thing AFTER UPDATE ON tasks\n\
             FOR EACH STATEMENT EXECUTE FUNCTION tasks_new_thing();"
        ),
        Vec::<String>::new()
    );
    // And every migration up to the cut-off does define functions: the
    // scan reads the files' real text.
    let old =
        std::fs::read_to_string(migrations_dir().join("20261121000006_task_counts.sql")).unwrap();
    assert_eq!(function_definitions(&old).len(), 4);
}

/// Applied once: a second migration applies nothing (the record keeps its
/// times); a file whose recorded text differs, or whose function is
/// missing, is applied again, and nothing else is.
#[tokio::test]
async fn a_function_file_is_applied_again_only_when_it_changed() {
    let db = TestDb::new().await;
    let schema = Schema::default();
    let applied = || async {
        sqlx::query_as::<_, (String, String)>(
            "SELECT name, applied_at::text FROM leasekeeper._function_files ORDER BY name",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    let first = applied().await;
    assert_eq!(
        first.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>(),
        function_files_on_disk()
    );
    migrate(&db.pool, &schema).await.unwrap();
    assert_eq!(
        applied().await,
        first,
        "an unchanged file was applied again"
    );

    // As if the file had changed since: its recorded checksum differs. And
    // a function dropped by hand.
    sqlx::raw_sql(
        "UPDATE leasekeeper._function_files SET checksum = '\\x00' WHERE name = 'task_counts_move';
         DROP FUNCTION leasekeeper.pruning();",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    migrate(&db.pool, &schema).await.unwrap();
    let again = applied().await;
    let changed: Vec<&str> = again
        .iter()
        .zip(&first)
        .filter(|(now, before)| now != before)
        .map(|(now, _)| now.0.as_str())
        .collect();
    assert_eq!(changed, vec!["pruning", "task_counts_move"]);
    let pinned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_proc WHERE pronamespace = 'leasekeeper'::regnamespace
            AND proname = 'pruning' AND proconfig @> ARRAY['search_path=\"leasekeeper\"']",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(pinned, 1, "pruning() is back, pinned to its schema");
}
