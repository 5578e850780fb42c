//! The web UI nimbus serves at `/`: one HTML page, a script and a style sheet, compiled into the
//! binary (`nimbus/ui/`), plain HTML/CSS/JS with no framework and nothing fetched from
//! elsewhere. The script reads the API's paths from the page (a JSON block that
//! [`cluster_state::api::ui_templates`] makes from the routes), so no path is spelled twice.
//!
//! ```text
//! GET /                    the page (cluster, topology, component, consumer-group views by #hash)
//! GET /ui/app.js           the script
//! GET /ui/style.css        the style sheet
//! GET /ui/favicon.svg      the icon
//! ```
//!
//! Security: the page runs under a Content-Security-Policy that allows only its own script,
//! style and API (`'self'`, no inline script, no frames, no form posts elsewhere), with
//! `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` and `Referrer-Policy:
//! no-referrer`. It reads with GETs like any client; every change it makes (activate,
//! deactivate, rebalance, kill, a reset plan) is a POST carrying the API token the user types
//! in, checked by nimbus as for any client, kept only in the tab's `sessionStorage`.

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

const INDEX: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/style.css");
const FAVICON: &str = include_str!("../ui/favicon.svg");

/// Where the page takes the API's path templates (a JSON object).
const ROUTES_MARK: &str = "{{ROUTES}}";

/// The policy every UI response carries (and API responses too: they are never a page).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One file of the UI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asset {
    Index,
    Script,
    Style,
    Icon,
}

impl Asset {
    /// The asset at `path`, if it is one.
    pub fn at(path: &str) -> Option<Asset> {
        match path {
            "/" | "/index.html" => Some(Asset::Index),
            "/ui/app.js" => Some(Asset::Script),
            "/ui/style.css" => Some(Asset::Style),
            "/ui/favicon.svg" => Some(Asset::Icon),
            _ => None,
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Asset::Index => "text/html; charset=utf-8",
            Asset::Script => "text/javascript; charset=utf-8",
            Asset::Style => "text/css; charset=utf-8",
            Asset::Icon => "image/svg+xml",
        }
    }

    /// The asset's bytes (the page with the API's paths filled in).
    pub fn body(self) -> Bytes {
        match self {
            Asset::Index => {
                let routes = serde_json::to_string(&cluster_state::api::ui_templates()).unwrap_or_default();
                // Inside a <script type="application/json"> block: no `<` may open a tag there.
                Bytes::from(INDEX.replace(ROUTES_MARK, &routes.replace('<', "\\u003c")))
            }
            Asset::Script => Bytes::from_static(APP_JS.as_bytes()),
            Asset::Style => Bytes::from_static(STYLE.as_bytes()),
            Asset::Icon => Bytes::from_static(FAVICON.as_bytes()),
        }
    }

    /// The response for a GET (or HEAD, `with_body` false) of the asset.
    pub fn response(self, with_body: bool) -> Response<Bytes> {
        let body = self.body();
        let length = body.len();
        let mut response = Response::new(if with_body { body } else { Bytes::new() });
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(self.content_type()));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        // The assets change with the binary only; a reload after an upgrade must see them.
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        add_security_headers(headers);
        response
    }
}

/// The headers every response of nimbus's HTTP port carries.
pub fn add_security_headers(headers: &mut hyper::HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

/// The UI's address of a component's page, relative to the page.
pub fn component_link(
    topology: &cluster_state::ids::TopologyId,
    component: &cluster_state::ids::ComponentId,
) -> String {
    format!("#/topology/{topology}/component/{component}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_carries_the_routes_and_loads_nothing_inline_or_from_elsewhere() {
        let page = String::from_utf8(Asset::Index.body().to_vec()).unwrap();
        assert!(!page.contains(ROUTES_MARK));
        let start = page.find("<script type=\"application/json\" id=\"routes\">").unwrap();
        let json = &page[start..].split_once('>').unwrap().1.split_once("</script>").unwrap().0;
        let routes: std::collections::BTreeMap<String, String> = serde_json::from_str(json).unwrap();
        assert_eq!(routes.len(), cluster_state::api::ui_templates().len());
        // The only executable script is the file; nothing comes from another origin.
        assert_eq!(page.matches("<script").count(), 2, "the routes block and app.js");
        assert!(page.contains("<script src=\"/ui/app.js\"></script>"));
        for text in [page.as_str(), APP_JS, STYLE] {
            // SVG's namespace is a name, not an address anything is loaded from.
            let text = text.replace("'http://www.w3.org/2000/svg'", "");
            assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"));
            assert!(!text.contains(" onclick=") && !text.contains("javascript:"));
        }
        assert!(!APP_JS.contains("innerHTML"), "text goes in as text, never as markup");
    }

    #[test]
    fn assets_have_types_and_headers() {
        for (path, kind) in [
            ("/", "text/html"),
            ("/ui/app.js", "text/javascript"),
            ("/ui/style.css", "text/css"),
            ("/ui/favicon.svg", "image/svg"),
        ] {
            let response: Response<Bytes> = Asset::at(path).unwrap().response(true);
            let headers = response.headers();
            assert!(headers[header::CONTENT_TYPE].to_str().unwrap().starts_with(kind), "{path}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert!(headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap().contains("script-src 'self'"));
        }
        assert_eq!(Asset::at("/ui/../daemon.rs"), None);
        assert_eq!(Asset::at("/ui/"), None);
    }
}
