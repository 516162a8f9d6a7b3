//! Who may use the controls: with a token set, the header says
//! "read-only" and links to a sign-in form. Signing in with the admin token
//! opens a server-side session ([`crate::auth`]): the `HttpOnly`,
//! `SameSite=Strict` cookie holds only the session's random id, never the
//! token; signing out deletes the session for every instance at once. The
//! form works without JavaScript.

use crate::error::AppError;
use leptos::prelude::*;
use serde::{Deserialize, Serialize};

/// Whether controls need a token, and whether this browser presented it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    /// A token is configured: controls (and, beyond loopback, reads) need a
    /// credential.
    pub token_required: bool,
    /// This request may use the controls.
    pub operator: bool,
}

/// This browser's access.
#[server(prefix = "/sfn")]
pub async fn get_access() -> Result<Access, AppError> {
    let state = super::context::state()?;
    let headers: axum::http::HeaderMap =
        leptos_axum::extract().await.map_err(AppError::internal)?;
    Ok(Access {
        token_required: crate::auth::is_locked(&state.settings),
        operator: crate::auth::is_operator(&state, &headers).await?,
    })
}

/// Checks `token` and, when it is the admin token, opens a session whose
/// id this browser keeps in its cookie.
#[server(prefix = "/sfn")]
pub async fn sign_in(token: String) -> Result<(), AppError> {
    check_and_open(token).await.map_err(super::context::refused)
}

#[cfg(feature = "ssr")]
async fn check_and_open(token: String) -> Result<(), AppError> {
    let state = super::context::state()?;
    if state.settings.admin_token.is_none() {
        return Err(if state.settings.worker_token.is_some() {
            AppError::Forbidden(
                "no admin token is set on this server (LEASEKEEPER_ADMIN_TOKEN): the controls are locked"
                    .into(),
            )
        } else {
            AppError::BadRequest(
                "no admin token is set on this server: the controls are open".into(),
            )
        });
    }
    if !crate::auth::is_admin_token(&state.settings, token.trim()) {
        return Err(AppError::Unauthorized("that is not the admin token".into()));
    }
    let headers: axum::http::HeaderMap =
        leptos_axum::extract().await.map_err(AppError::internal)?;
    let cookie = crate::auth::open_session(&state, crate::auth::came_over_https(&headers)).await?;
    set_cookie(&cookie);
    leptos_axum::redirect("/");
    Ok(())
}

/// Ends this browser's session (everywhere) and forgets its cookie.
#[server(prefix = "/sfn")]
pub async fn sign_out() -> Result<(), AppError> {
    let state = super::context::state()?;
    let headers: axum::http::HeaderMap =
        leptos_axum::extract().await.map_err(AppError::internal)?;
    let cookie = crate::auth::close_session(&state, &headers)
        .await
        .map_err(super::context::refused)?;
    set_cookie(&cookie);
    leptos_axum::redirect("/");
    Ok(())
}

#[cfg(feature = "ssr")]
fn set_cookie(value: &str) {
    if let (Some(resp), Ok(v)) = (
        use_context::<leptos_axum::ResponseOptions>(),
        axum::http::HeaderValue::from_str(value),
    ) {
        resp.append_header(axum::http::header::SET_COOKIE, v);
    }
}

/// The header's access indicator: nothing when controls are open.
#[component]
pub fn AccessBadge() -> impl IntoView {
    let access = Resource::new(|| (), |_| get_access());
    let sign_out = ServerAction::<SignOut>::new();
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                match access.await {
                    Ok(Access { token_required: false, .. }) => None,
                    Ok(Access { operator: true, .. }) => Some(view! {
                        <ActionForm action=sign_out attr:class="inline">
                            <span class="text-xs text-emerald-800" data-testid="access-state" data-access="operator">"operator "</span>
                            <button type="submit" class="text-xs text-indigo-700 underline" data-testid="sign-out">"sign out"</button>
                        </ActionForm>
                    }.into_any()),
                    Ok(_) => Some(view! {
                        <span class="text-xs" data-testid="access-state" data-access="read-only">
                            "read-only · "
                            <a class="text-indigo-700 underline" href="/signin" data-testid="sign-in-link">"sign in to use controls"</a>
                        </span>
                    }.into_any()),
                    Err(_) => None,
                }
            })}
        </Transition>
    }
}

/// `/signin`: the admin token form.
#[component]
pub fn SignInPage() -> impl IntoView {
    let action = ServerAction::<SignIn>::new();
    view! {
        <section class="mx-auto max-w-md rounded border border-slate-200 bg-white p-6" data-testid="sign-in">
            <h1 class="text-xl font-semibold">"Sign in"</h1>
            <p class="mt-1 text-sm text-slate-600">
                "This server's controls need its admin token (LEASEKEEPER_ADMIN_TOKEN). The token stays on the server: this browser keeps only a session, for a day or until you sign out."
            </p>
            <ActionForm action=action attr:class="mt-4 flex flex-col gap-2">
                <label for="admin-token" class="text-sm font-medium">"Admin token"</label>
                <input id="admin-token" name="token" type="password" autocomplete="current-password" required
                    class="rounded border border-slate-300 px-2 py-1" data-testid="sign-in-token"/>
                <button type="submit" class="self-start rounded bg-indigo-600 px-3 py-1 text-sm font-medium text-white hover:bg-indigo-700" data-testid="sign-in-submit">
                    "Sign in"
                </button>
            </ActionForm>
            {move || action.value().get().and_then(|r| r.err()).map(|e| view! {
                <super::widgets::Notice kind="error" testid="sign-in-error" text=e.to_string()/>
            })}
        </section>
    }
}
