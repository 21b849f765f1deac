//! Reading a handler's body up to the layer's limit: whole (to store), or, past the limit, a
//! body that replays what was read and streams the rest (passed through, never held whole).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A handler's body, read as far as the limit allows.
pub(super) enum Read<B> {
    /// The whole body, within the limit and without trailers: it can be stored.
    Whole(Bytes),
    /// Over the limit (or with trailers): not stored; the client gets all of it from this.
    PassThrough(Replay<B>),
}

/// Reads `body` while it stays within `limit` bytes. A body whose size hint already says it is
/// larger is not read at all.
pub(super) async fn read<B>(body: B, limit: usize) -> Read<B>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut read: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut total = 0usize;
    let pass = |read, body| {
        Read::PassThrough(Replay {
            read,
            rest: Rest::Body(body),
        })
    };
    if body.size_hint().lower() > limit as u64 {
        return pass(read, body);
    }
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let Some(data) = frame.data_ref() else {
                    // Trailers: the stored form has no place for them.
                    read.push_back(frame);
                    return pass(read, body);
                };
                total = total.saturating_add(data.len());
                read.push_back(frame);
                if total > limit {
                    return pass(read, body);
                }
            }
            // The body failed part-way: the client gets what came and then the error.
            Some(Err(e)) => {
                return Read::PassThrough(Replay {
                    read,
                    rest: Rest::Failed(Some(e.into())),
                })
            }
        }
    }
    let mut whole = Vec::with_capacity(total);
    for frame in read {
        if let Ok(data) = frame.into_data() {
            whole.extend_from_slice(&data);
        }
    }
    Read::Whole(Bytes::from(whole))
}

/// The frames already read, then the rest of the body.
pub(super) struct Replay<B> {
    read: VecDeque<Frame<Bytes>>,
    rest: Rest<B>,
}

/// What follows the frames already read.
enum Rest<B> {
    Body(Pin<Box<B>>),
    /// The body failed while it was read: its error, once.
    Failed(Option<BoxError>),
}

impl<B> HttpBody for Replay<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut self.rest {
            Rest::Body(rest) => rest
                .as_mut()
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map_err(Into::into))),
            Rest::Failed(error) => Poll::Ready(error.take().map(Err)),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self
            .read
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let mut hint = match &self.rest {
            Rest::Body(rest) => rest.size_hint(),
            Rest::Failed(_) => SizeHint::default(),
        };
        // Upper first: a lower bound above the upper one panics.
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(read));
        }
        hint.set_lower(hint.lower().saturating_add(read));
        hint
    }
}
