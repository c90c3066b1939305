//! The web page: the files of the top-level `web/` folder, embedded in the binary and served at
//! `/` and `/assets/{*path}`. The page is a no-build single-page app (HTML, CSS, ES modules, a
//! vendored chart library); it routes on the URL fragment, so the server has one HTML document
//! to serve. `include_bytes!` makes each file a dependency of the build, so editing one
//! rebuilds the server; a test checks that every file in `web/` is listed here.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
// ES modules are refused by browsers unless served with a JavaScript MIME type.
const JS: &str = "text/javascript; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

macro_rules! asset {
    ($path:literal, $content_type:expr) => {
        ($path, $content_type, include_bytes!(concat!("../../../web/", $path)) as &[u8])
    };
}

/// Every embedded asset: (path under `web/`, content type, bytes).
const ASSETS: &[(&str, &str, &[u8])] = &[
    asset!("index.html", HTML),
    asset!("style.css", CSS),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("auth.js", JS),
    asset!("dom.js", JS),
    asset!("nav.js", JS),
    asset!("params.js", JS),
    asset!("reasons.js", JS),
    asset!("charts.js", JS),
    asset!("queue.js", JS),
    asset!("sweep.js", JS),
    asset!("leaderboard.js", JS),
    asset!("parcoords.js", JS),
    asset!("curves.js", JS),
    asset!("scatter.js", JS),
    asset!("compare.js", JS),
    asset!("analysis.js", JS),
    asset!("job.js", JS),
    asset!("jobgpu.js", JS),
    asset!("log.js", JS),
    asset!("workers.js", JS),
    asset!("submit.js", JS),
    asset!("vendor/uPlot.iife.min.js", JS),
    asset!("vendor/uPlot.min.css", CSS),
    asset!("vendor/uPlot.LICENSE", TEXT),
];

pub fn router() -> Router<AppState> {
    Router::new().route("/", get(index)).route("/assets/{*file}", get(asset))
}

async fn index() -> Response {
    serve("index.html").unwrap_or_else(IntoResponse::into_response)
}

async fn asset(Path(file): Path<String>) -> Response {
    serve(&file).unwrap_or_else(IntoResponse::into_response)
}

fn serve(file: &str) -> Result<Response, ApiError> {
    let (_, content_type, bytes) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file)
        .ok_or_else(|| ApiError::NotFound(format!("no asset named {file}")))?;
    Ok(([(header::CONTENT_TYPE, *content_type), (header::CACHE_CONTROL, "no-cache")], *bytes).into_response())
}

#[cfg(test)]
mod tests {
    use super::ASSETS;
    use std::path::Path;

    /// Every file under `web/`, relative and with `/`.
    fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files_under(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }

    #[test]
    fn every_file_in_web_is_embedded_and_nothing_else() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../web");
        let mut on_disk = Vec::new();
        files_under(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|(name, _, _)| name.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "add new files under web/ to ASSETS in page.rs");
    }

    #[test]
    fn scripts_are_served_as_javascript_and_styles_as_css() {
        for (name, content_type, _) in ASSETS {
            if name.ends_with(".js") {
                assert!(content_type.starts_with("text/javascript"), "{name}: {content_type}");
            }
            if name.ends_with(".css") {
                assert!(content_type.starts_with("text/css"), "{name}: {content_type}");
            }
        }
    }
}
