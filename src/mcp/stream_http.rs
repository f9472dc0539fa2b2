//! `POST /v1/stream` of `serve --http`: a script streamed in a chunked request body, as a
//! harness forwards a model's output while it is written (MCP cannot stream a tool call's
//! arguments, so this is not an MCP endpoint). The answer's head comes at once, with the run's
//! id in `Toolscript-Run-Id`; its body, when the run has ended, is `run_script`'s JSON.
//!
//! The same checks as `/mcp` come first (`Host`, `Origin`, the bearer token under `--auth`),
//! then the right `run` and the tenant's cap on runs going, as for `run_script`. Options are in
//! the query: `sequential=true`, `stats=true`, `input=` (URL-encoded JSON). The body is bounded
//! as a message to `/mcp` is (`MAX_MESSAGE` bytes), each chunk must come within the idle
//! timeout, and the whole text within the tenant's `stream_timeout_s`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use rmcp::model::CallToolResult;
use serde_json::Value;

use super::auth::{Caller, Right};
use super::server::{report_json, Server, MAX_MESSAGE};
use crate::report::Mode;
use crate::runtime::RunOptions;

/// The path of the streaming endpoint.
pub const STREAM_PATH: &str = "/v1/stream";

type Answer = Response<BoxBody<Bytes, Infallible>>;

/// The answer to a request for [`STREAM_PATH`], its `Host`, `Origin` and token checked.
pub(super) async fn answer(
    request: Request<Incoming>,
    server: &Server,
    caller: Option<Caller>,
    idle: Duration,
) -> Answer {
    if request.method() != Method::POST {
        return json(
            StatusCode::METHOD_NOT_ALLOWED,
            &error_json(format!(
                "{STREAM_PATH} takes a POST whose body is the script's text, sent as it is written"
            )),
        );
    }
    let query = match Query::parse(request.uri().query().unwrap_or_default()) {
        Ok(query) => query,
        Err(why) => return json(StatusCode::BAD_REQUEST, &error_json(why)),
    };
    let mut scoped = server.clone();
    if let Some(tenancy) = &server.tenancy {
        let Some(caller) = caller else {
            return json(
                StatusCode::UNAUTHORIZED,
                &error_json("this server requires a bearer token".into()),
            );
        };
        if !caller.rights.allow(Right::Run) {
            let why = format!("{STREAM_PATH} needs the right `run`, which this token lacks");
            return json(StatusCode::FORBIDDEN, &error_json(why));
        }
        match tenancy.runtime_of(&caller) {
            Ok(runtime) => scoped.runtime = runtime,
            Err(refused) => return json(StatusCode::FORBIDDEN, &result_json(refused)),
        }
        scoped.caller = Some(caller);
    }
    let slot = match scoped.slot() {
        Ok(slot) => slot,
        Err(refused) => return json(StatusCode::TOO_MANY_REQUESTS, &result_json(refused)),
    };
    let mut options =
        RunOptions::with_mode(Mode::sequential_if(query.sequential)).script_name("run_script");
    if let Some(input) = query.input {
        options = options.input(input);
    }
    let options = scoped.owned(options);
    let chunks = body_chunks(request.into_body(), idle);
    // The run goes on in a task of its own, so that the answer's head (with the run's id) is
    // sent while the body still arrives; the task ends with the answer's body.
    let (id_tx, id_rx) = tokio::sync::oneshot::channel();
    let runtime = Arc::clone(&scoped.runtime);
    let stats = query.stats;
    let task = tokio::spawn(async move {
        let _slot = slot;
        let run = runtime.run_streaming(chunks, options);
        let _ = id_tx.send(run.run_id().to_string());
        let outcome = run.outcome().await;
        tracing::debug!(run_id = %outcome.run_id, ok = outcome.result.is_ok(), "a streamed run ran");
        report_json(&outcome, stats)
    });
    let abort = AbortOnDrop(task.abort_handle());
    let Ok(run_id) = id_rx.await else {
        return json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &error_json("the run could not start".into()),
        );
    };
    let body = futures::stream::once(async move {
        let _abort = abort;
        let text = match task.await {
            Ok(value) => value.to_string(),
            Err(e) => error_json(format!("the run ended abnormally: {e}")).to_string(),
        };
        Ok::<_, Infallible>(Frame::data(Bytes::from(text + "\n")))
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(body)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(id) = HeaderValue::from_str(&run_id) {
        headers.insert("toolscript-run-id", id);
    }
    response
}

/// Aborts the run's task when the answer's body is dropped unwritten (the client went away).
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The request body's data, chunk by chunk as it arrives: an error (the stream cut off) when
/// the connection fails, a chunk does not come within `idle`, or the body passes
/// [`MAX_MESSAGE`] bytes.
fn body_chunks(
    body: Incoming,
    idle: Duration,
) -> impl futures::Stream<Item = Result<Bytes, String>> + Send + 'static {
    let frames = BodyStream::new(body);
    futures::stream::unfold(
        (frames, 0usize, false),
        move |(mut frames, seen, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let next = match tokio::time::timeout(idle, frames.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        let why = format!("no byte of the script came for {idle:?}");
                        return Some((Err(why), (frames, seen, true)));
                    }
                };
                let frame = match next {
                    None => return None,
                    Some(Err(e)) => {
                        return Some((
                            Err(format!("reading the body failed: {e}")),
                            (frames, seen, true),
                        ))
                    }
                    Some(Ok(frame)) => frame,
                };
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let seen = seen + data.len();
                if seen > MAX_MESSAGE {
                    let why =
                        format!("the body passed {MAX_MESSAGE} bytes, the most a message may have");
                    return Some((Err(why), (frames, seen, true)));
                }
                return Some((Ok(data), (frames, seen, false)));
            }
        },
    )
}

/// The options in the query string.
#[derive(Default, Debug)]
struct Query {
    sequential: bool,
    stats: bool,
    input: Option<Value>,
}

impl Query {
    fn parse(query: &str) -> Result<Query, String> {
        let mut out = Query::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
            let value = percent_decode(value)
                .ok_or_else(|| format!("the query's `{key}` is not URL-encoded UTF-8"))?;
            let flag = || match value.as_str() {
                "true" | "1" | "" => Ok(true),
                "false" | "0" => Ok(false),
                other => Err(format!(
                    "the query's `{key}` takes true or false, not `{other}`"
                )),
            };
            match key {
                "sequential" => out.sequential = flag()?,
                "stats" => out.stats = flag()?,
                "input" => {
                    let input: Value = serde_json::from_str(&value).map_err(|e| {
                        format!("the query's `input` is not JSON ({e}): give URL-encoded JSON, e.g. input=%7B%22id%22%3A3%7D")
                    })?;
                    out.input = Some(input).filter(|v| !v.is_null());
                }
                other => {
                    return Err(format!(
                    "unknown query option `{other}`: the options are sequential, stats and input"
                ))
                }
            }
        }
        Ok(out)
    }
}

/// `%XX` and `+` decoded; `None` for a bad escape or text that is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn error_json(message: String) -> Value {
    serde_json::json!({"ok": false, "status": "failed", "error": {"kind": "invalid_request", "message": message}})
}

/// A refusal made for an MCP tool, as JSON.
fn result_json(result: CallToolResult) -> Value {
    if let Some(value) = result.structured_content {
        return value;
    }
    let text: Vec<String> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    error_json(text.join("\n"))
}

fn json(status: StatusCode, value: &Value) -> Answer {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string() + "\n")).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_takes_its_three_options_and_names_a_wrong_one() {
        let q = Query::parse("sequential=true&stats&input=%7B%22id%22%3A+3%7D").unwrap();
        assert!(q.sequential && q.stats);
        assert_eq!(q.input, Some(serde_json::json!({"id": 3})));
        assert!(Query::parse("seq=1")
            .unwrap_err()
            .contains("sequential, stats and input"));
        assert!(Query::parse("input=%7B").unwrap_err().contains("not JSON"));
        assert!(Query::parse("stats=maybe")
            .unwrap_err()
            .contains("true or false"));
        assert!(Query::parse("input=%ZZ")
            .unwrap_err()
            .contains("URL-encoded"));
    }
}
