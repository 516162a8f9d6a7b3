//! Time on the page: deadlines counted down by the browser's clock from
//! the server's figure, relative ages, and times in the reader's zone.

use super::live::Live;
use leptos::prelude::*;

/// `ms` (a time left, by the database clock when the page data was read)
/// counting down by the browser's clock from the moment it is first seen
/// in the browser; constant on the server. Read it with `try_get`: a row
/// removed by a refetch can be disposed while a clock tick is still
/// re-running its view, and a plain `get` then panics.
pub fn remaining(ms: i64) -> Signal<i64> {
    let Some(live) = use_context::<Live>() else {
        return Signal::stored(ms);
    };
    let seen_at = StoredValue::new(None::<f64>);
    Signal::derive(move || {
        let now = live.clock.get();
        if now == 0.0 {
            return ms;
        }
        // Anchored at the real moment it is first seen, not at the last
        // tick (up to 250 ms earlier): counting from the tick made the
        // countdown reach zero, and the page say "late", before the
        // database's deadline had passed.
        let start = seen_at.try_get_value().flatten().unwrap_or_else(|| {
            let at = first_seen_at(now);
            seen_at.try_set_value(Some(at));
            at
        });
        ms - (now - start).max(0.0) as i64
    })
}

/// The browser's clock right now (the last tick, `tick`, on the server).
fn first_seen_at(tick: f64) -> f64 {
    #[cfg(feature = "hydrate")]
    {
        let _ = tick;
        js_sys::Date::now()
    }
    #[cfg(not(feature = "hydrate"))]
    {
        tick
    }
}

/// "in 4.2 s" / "4.2 s ago" for a time `ms` milliseconds away.
pub fn relative(ms: i64) -> String {
    let secs = ms.abs() as f64 / 1000.0;
    let amount = if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        format!("{:.0} min", secs / 60.0)
    } else {
        format!("{:.1} h", secs / 3600.0)
    };
    if ms >= 0 {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// How long ago `at` was, by the browser's clock (nothing before hydration:
/// show the time itself beside it, as [`LocalTime`]).
#[component]
pub fn Age(at: chrono::DateTime<chrono::Utc>) -> impl IntoView {
    let clock = use_context::<Live>().map(|l| l.clock);
    move || {
        let now = clock.map(|c| c.get()).unwrap_or(0.0);
        (now > 0.0).then(|| relative(at.timestamp_millis() - now as i64))
    }
}

/// A time shown in the viewer's local time zone once hydrated (UTC in the
/// server's HTML), with the UTC instant in `datetime` and the tooltip.
#[component]
pub fn LocalTime(at: chrono::DateTime<chrono::Utc>) -> impl IntoView {
    let utc = at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string();
    let iso = at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let clock = use_context::<Live>().map(|l| l.clock);
    let utc_text = utc.clone();
    let text = move || {
        let hydrated = clock.map(|c| c.get() > 0.0).unwrap_or(false);
        if hydrated {
            local_text(at).unwrap_or_else(|| utc_text.clone())
        } else {
            utc_text.clone()
        }
    };
    view! {
        <time datetime=iso title=utc class="tabular-nums">
            {text}
        </time>
    }
}

/// `at` in the browser's time zone, `YYYY-MM-DD HH:MM:SS.mmm`.
#[cfg(feature = "hydrate")]
fn local_text(at: chrono::DateTime<chrono::Utc>) -> Option<String> {
    let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(
        at.timestamp_millis() as f64
    ));
    Some(format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
        d.get_full_year(),
        d.get_month() + 1,
        d.get_date(),
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds(),
        d.get_milliseconds()
    ))
}

#[cfg(not(feature = "hydrate"))]
fn local_text(_at: chrono::DateTime<chrono::Utc>) -> Option<String> {
    None
}
