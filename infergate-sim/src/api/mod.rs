//! The route table of a simulated engine: which handler serves each method and path (handlers sit by API family).

mod completions;
mod generate;
mod info;
mod messages;
mod parse;
mod reply;
mod respond;
mod responses;
mod sim;

use std::sync::Arc;

use super::engine::Engine;
use super::http::{ConnIo, InBuf, Request};
use super::tokenize::ApiKind;
use generate::generate;
use respond::{respond_error, respond_no_route};

/// Serves one request; returns whether the connection stays open for the next one.
pub(crate) async fn handle(
    eng: &Arc<Engine>,
    req: Request,
    seq: u64,
    io: &mut ConnIo,
    rb: &mut InBuf,
) -> bool {
    let method = req.method.as_str();
    let get = method == "GET" || method == "HEAD";
    let post = method == "POST";
    match req.path.as_str() {
        "/health" if get => info::health(eng, &req, io, rb).await,
        "/v1/models" if get => info::models(eng, &req, io, rb).await,
        "/version" if get => info::version(&req, io, rb).await,
        "/metrics" if get => info::metrics(eng, &req, io, rb).await,
        "/sim/stats" if get => sim::stats(eng, &req, io, rb).await,
        "/sim/requests" if get => sim::requests(eng, &req, io, rb).await,
        "/sim/control" if get => sim::control(eng, &req, io, rb).await,
        "/sim/control" if post => sim::set_control(eng, &req, io, rb).await,
        "/v1/messages/count_tokens" if post => messages::count_tokens(eng, &req, io, rb).await,
        "/tokenize" if post => info::tokenize(eng, &req, io, rb).await,
        "/v1/chat/completions" if post => generate(eng, ApiKind::Chat, req, seq, io, rb).await,
        "/v1/completions" if post => generate(eng, ApiKind::Completion, req, seq, io, rb).await,
        "/v1/messages" if post => generate(eng, ApiKind::Messages, req, seq, io, rb).await,
        "/v1/responses" if post => generate(eng, ApiKind::Responses, req, seq, io, rb).await,
        p if p.starts_with("/v1/responses/") => responses::stored_response(eng, &req, io, rb).await,
        "/health"
        | "/v1/models"
        | "/version"
        | "/metrics"
        | "/sim/stats"
        | "/sim/requests"
        | "/sim/control"
        | "/tokenize"
        | "/v1/messages/count_tokens"
        | "/v1/chat/completions"
        | "/v1/completions"
        | "/v1/messages"
        | "/v1/responses" => respond_error(io, rb, &req, None, 405, "Method Not Allowed").await,
        _ => respond_no_route(io, rb, &req).await,
    }
}
