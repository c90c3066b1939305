//! The names user tokens carry (decision 0074). A line of a user token file, or an entry of
//! `APP_USER_TOKEN` (comma-separated), is one of:
//!
//! - `TOKEN`: the user `default`, as every user token was before names;
//! - `NAME:TOKEN`: the user NAME;
//! - `admin:NAME:TOKEN`: the user NAME, who may also change anyone's sweeps.
//!
//! A token holds no `:` (nor, in `APP_USER_TOKEN`, a `,`), so an entry reads one way only.
//! Errors say where (the file's line, the variable's entry) and what is wrong, never the token,
//! nor text that is no name (it may be part of a token).

use crate::error::ApiError;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use shared::names::{check_user_name, DEFAULT_USER};

/// Who a user request comes from: the name its token carries, and whether that user is an admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub admin: bool,
}

impl Caller {
    /// Every request to a server without tokens (the open local mode): the user `default`,
    /// who may change everything, as anyone who reaches such a server always could.
    pub fn open() -> Caller {
        Caller { name: DEFAULT_USER.into(), admin: true }
    }

    /// Ok when this caller may change something `owner` owns; else 403 naming the owner.
    /// `what` words the thing (`sweep grid`, `job 12's sweep grid`).
    pub fn may_change(&self, owner: &str, what: impl FnOnce() -> String) -> Result<(), ApiError> {
        if self.admin || self.name == owner {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!("{} belongs to {owner}: only {owner} or an admin may change it", what())))
    }
}

/// The middleware puts the caller of every user request in its extensions (`auth::authorize`).
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            ApiError::Unauthorized("this needs a user token: send `Authorization: Bearer <token>`".into())
        })
    }
}

/// One entry of a user token list, read.
#[derive(Debug, PartialEq, Eq)]
pub struct UserToken<'a> {
    pub name: String,
    pub admin: bool,
    pub token: &'a str,
}

/// Reads `TOKEN`, `NAME:TOKEN` or `admin:NAME:TOKEN`; the error says what is wrong without
/// repeating any of the entry.
pub fn parse_entry(entry: &str) -> Result<UserToken<'_>, String> {
    let fields: Vec<&str> = entry.trim().split(':').collect();
    let (name, admin, token) = match fields[..] {
        [token] => (DEFAULT_USER, false, token),
        [name, token] => (name, false, token),
        ["admin", name, token] => (name, true, token),
        _ => {
            return Err("is not `TOKEN`, `NAME:TOKEN` or `admin:NAME:TOKEN` (a token cannot hold `:`)".into());
        }
    };
    if token.is_empty() {
        return Err("has no token after its name".into());
    }
    check_user_name(name).map_err(|why| format!("has a bad name: {why}"))?;
    Ok(UserToken { name: name.to_string(), admin, token })
}

/// The entries of a token file: `(line number, entry)`, blank lines and `#` comments skipped.
pub fn file_entries(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(at, line)| (at + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
}

/// The entries of `APP_USER_TOKEN`: `(position, entry)`, counted from 1, blank ones skipped.
pub fn list_entries(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split(',').map(str::trim).enumerate().map(|(at, entry)| (at + 1, entry)).filter(|(_, entry)| !entry.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123";

    #[test]
    fn the_three_forms_read_as_their_user() {
        let plain = parse_entry(TOKEN).unwrap();
        assert_eq!(plain, UserToken { name: "default".into(), admin: false, token: TOKEN });
        let (named, admin) = (format!("user-a:{TOKEN}"), format!("  admin:lab.lead:{TOKEN} "));
        assert_eq!(parse_entry(&named).unwrap(), UserToken { name: "user-a".into(), admin: false, token: TOKEN });
        assert_eq!(parse_entry(&admin).unwrap(), UserToken { name: "lab.lead".into(), admin: true, token: TOKEN });
        // A user called `admin` is no admin by the name alone.
        assert!(!parse_entry(&format!("admin:{TOKEN}")).unwrap().admin);
    }

    #[test]
    fn a_malformed_entry_or_a_bad_name_is_refused_without_repeating_it() {
        let secret = "s3cretToken0123456789";
        for (entry, says) in [
            (format!("a:b:{secret}"), "is not `TOKEN`"),
            (format!("admin:a:b:{secret}"), "is not `TOKEN`"),
            (format!("{secret}:"), "no token"),
            ("admin:user-a:".to_string(), "no token"),
            (format!(":{secret}"), "bad name"),
            (format!("User-A:{secret}"), "bad name"),
            (format!("Secret-Part:{secret}"), "bad name"),
            (format!("{}:{secret}", "x".repeat(33)), "bad name"),
            (format!("admin::{secret}"), "bad name"),
        ] {
            let error = parse_entry(&entry).unwrap_err();
            assert!(error.contains(says), "{entry}: {error}");
            assert!(!error.contains(secret) && !error.contains("Secret-Part"), "the error repeats the entry: {error}");
        }
    }

    #[test]
    fn entries_are_numbered_as_people_count_lines() {
        let text = "# the lab\n\nuser-a:aaaa\n  \nuser-b:bbbb\n";
        assert_eq!(file_entries(text).collect::<Vec<_>>(), vec![(3, "user-a:aaaa"), (5, "user-b:bbbb")]);
        assert_eq!(
            list_entries(" user-a:aaaa, ,user-b:bbbb").collect::<Vec<_>>(),
            vec![(1, "user-a:aaaa"), (3, "user-b:bbbb")]
        );
    }

    #[test]
    fn only_the_owner_or_an_admin_may_change_a_sweep() {
        let user = Caller { name: "user-b".into(), admin: false };
        assert!(user.may_change("user-b", || "sweep grid".into()).is_ok());
        let refused = user.may_change("user-a", || "sweep grid".into()).unwrap_err().to_string();
        assert_eq!(refused, "sweep grid belongs to user-a: only user-a or an admin may change it");
        assert!(Caller { name: "root".into(), admin: true }.may_change("user-a", String::new).is_ok());
        assert!(Caller::open().may_change("user-a", String::new).is_ok());
    }
}
