//! Pooled frame buffers: a frame is copied once from the sender's TX descriptors into a
//! [`PooledFrame`], shared (`Arc`) by every port it is queued for, and its buffer goes back to the
//! pool when the last receiver has written it into guest memory.

use std::ops::Deref;
use std::sync::{Arc, Mutex};

/// A bounded free list of frame buffers.
#[derive(Debug)]
pub struct FramePool {
    free: Mutex<Vec<Vec<u8>>>,
    max_pooled: usize,
    buf_capacity: usize,
}

impl FramePool {
    /// A pool that keeps up to `max_pooled` free buffers of `buf_capacity` bytes. Buffers that
    /// grew past twice that size (jumbo frames) are freed instead of pooled.
    pub fn new(max_pooled: usize, buf_capacity: usize) -> Arc<Self> {
        Arc::new(FramePool {
            free: Mutex::new(Vec::new()),
            max_pooled,
            buf_capacity,
        })
    }

    /// An empty frame backed by a pooled buffer (or a new one if the pool is empty).
    pub fn take(self: &Arc<Self>) -> PooledFrame {
        let buf = self
            .free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.buf_capacity));
        PooledFrame {
            data: buf,
            pool: Arc::clone(self),
        }
    }

    /// Free buffers currently pooled.
    pub fn pooled(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() > 2 * self.buf_capacity {
            return;
        }
        buf.clear();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.max_pooled {
            free.push(buf);
        }
    }
}

/// One frame (Ethernet header onwards, no virtio-net header) in a pooled buffer.
#[derive(Debug)]
pub struct PooledFrame {
    data: Vec<u8>,
    pool: Arc<FramePool>,
}

impl PooledFrame {
    /// The buffer, to fill it.
    pub(crate) fn buf_mut(&mut self) -> &mut Vec<u8> {
        &mut self.data
    }
}

impl Deref for PooledFrame {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for PooledFrame {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.data));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_return_to_the_pool_up_to_its_bound() {
        let pool = FramePool::new(2, 2048);
        let frames: Vec<_> = (0..3).map(|_| pool.take()).collect();
        assert_eq!(pool.pooled(), 0);
        drop(frames);
        assert_eq!(pool.pooled(), 2);
        let mut f = pool.take();
        assert!(f.is_empty());
        assert!(f.buf_mut().capacity() >= 2048);
        assert_eq!(pool.pooled(), 1);
    }

    #[test]
    fn jumbo_buffers_are_not_kept() {
        let pool = FramePool::new(4, 2048);
        let mut f = pool.take();
        f.buf_mut().resize(9000, 0);
        drop(f);
        assert_eq!(pool.pooled(), 0);
    }
}
