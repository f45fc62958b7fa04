//! [`EngineLayer`]: an engine wrapped around another (counters, a throttle, a test's fault
//! injection) states only what it changes; every other [`IoEngine`] method is the inner
//! engine's, through the blanket implementation below.

use super::engine::{FileId, IoEngine, IoQueue};
use super::AlignedBuf;
use std::path::Path;

/// A wrapper around an inner [`IoEngine`]. Every type that implements it is an [`IoEngine`]
/// whose methods are the inner engine's, except the queue ([`EngineLayer::wrap_queue`]: the
/// layer's queue around the inner engine's) and the description
/// ([`EngineLayer::describe_layer`]).
pub trait EngineLayer: Send + Sync {
    /// The wrapped engine.
    fn inner(&self) -> &dyn IoEngine;

    /// This layer's queue around `inner`, a new queue of the inner engine (default: `inner`
    /// itself).
    fn wrap_queue<'a>(&'a self, inner: Box<dyn IoQueue + 'a>) -> Box<dyn IoQueue + 'a> {
        inner
    }

    /// The description (default: the inner engine's).
    fn describe_layer(&self) -> String {
        self.inner().describe()
    }
}

impl<L: EngineLayer> IoEngine for L {
    fn name(&self) -> &'static str {
        self.inner().name()
    }
    fn queue_depth(&self) -> usize {
        self.inner().queue_depth()
    }
    fn describe(&self) -> String {
        self.describe_layer()
    }
    fn path(&self, file: FileId) -> Option<&Path> {
        self.inner().path(file)
    }
    fn buffer(&self, len: usize, align: usize) -> AlignedBuf {
        self.inner().buffer(len, align)
    }
    fn queue(&self) -> std::io::Result<Box<dyn IoQueue + '_>> {
        Ok(self.wrap_queue(self.inner().queue()?))
    }
    fn concurrent_pieces(&self) -> bool {
        self.inner().concurrent_pieces()
    }
    fn verify_piece_bytes(&self) -> usize {
        self.inner().verify_piece_bytes()
    }
    fn verify_lone_records_in_pieces(&self) -> bool {
        self.inner().verify_lone_records_in_pieces()
    }
}
