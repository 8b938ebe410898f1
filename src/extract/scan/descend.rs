//! The descent along a shape's pointers ([`Scanner::walk`], [`Scanner::each`]): objects'
//! keys matched against a node's children, arrays' elements as events or indexed steps, and
//! leaves captured; everything off the paths skipped by the scanner's grammar check.

use super::{MAX_DEPTH, NotJson, Result, Scanner};
use crate::extract::walk::{Captures, EventCaps};
use crate::extract::{Node, mask};

impl<'de> Scanner<'de> {
    /// Opens a container along a path, one level deeper.
    #[inline]
    fn open(&mut self, depth: usize) -> Result<usize> {
        if depth >= MAX_DEPTH {
            return Err(NotJson);
        }
        self.at += 1;
        Ok(depth + 1)
    }

    /// The value at `node` of event `at`: descends into an object or array along the
    /// pointers; a scalar there holds none of them.
    pub(in crate::extract) fn walk(
        &mut self,
        node: &Node,
        at: usize,
        caps: &mut Captures<'de>,
        depth: usize,
    ) -> Result<()> {
        match self.peek_ws() {
            Some(b'{') => {
                let depth = self.open(depth)?;
                self.object(node, at, caps, depth)
            }
            Some(b'[') => {
                let depth = self.open(depth)?;
                self.array(node, at, caps, depth)
            }
            _ => self.scalar(),
        }
    }

    /// An object's members, after its `{`: the keys of `node`'s children walked, the others
    /// skipped.
    fn object(
        &mut self,
        node: &Node,
        at: usize,
        caps: &mut Captures<'de>,
        depth: usize,
    ) -> Result<()> {
        if self.peek_ws() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        // Children met so far (a shape's nodes have a handful; past 64 none is tracked).
        let mut met = 0u64;
        loop {
            self.expect(b'"')?;
            let child = self.key(node)?;
            self.expect(b':')?;
            match child {
                Some((i, child)) => {
                    let bit = 1u64.checked_shl(u32::try_from(i).unwrap_or(u32::MAX));
                    let again = bit.is_some_and(|b| met & b != 0);
                    met |= bit.unwrap_or(0);
                    if again && child.target.is_none() {
                        // A key on the way to facts stated twice: merging the two objects
                        // would be a reading no other parser makes. Everything under it is
                        // ambiguous.
                        caps.events[at].conflicts |= child.mask;
                        if child.mask & mask::EVENTS != 0 {
                            caps.ambiguous = true;
                        }
                        self.skip()?;
                    } else {
                        self.step(child, at, caps, depth)?;
                    }
                }
                None => self.skip()?,
            }
            match self.peek_ws() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(NotJson),
            }
        }
    }

    /// A key, after its opening quote, matched against `node`'s children without allocating
    /// (a key with escapes is decoded first): the child's index and node.
    #[inline]
    fn key<'n>(&mut self, node: &'n Node) -> Result<Option<(usize, &'n Node)>> {
        let start = self.at;
        let seen = self.string()?;
        let inner = self.bytes.get(start..self.at - 1).ok_or(NotJson)?;
        let find = |key: &[u8]| {
            node.children
                .iter()
                .enumerate()
                .find(|(_, (t, _, _))| t.as_bytes() == key)
                .map(|(i, (_, _, n))| (i, n))
        };
        if seen.escaped {
            self.at = start;
            let key = self.text()?;
            return Ok(find(key.as_bytes()));
        }
        if !seen.ascii && std::str::from_utf8(inner).is_err() {
            return Err(NotJson);
        }
        Ok(find(inner))
    }

    /// An array's elements, after its `[`: those at `node`'s index children walked, the
    /// others skipped.
    fn array(
        &mut self,
        node: &Node,
        at: usize,
        caps: &mut Captures<'de>,
        depth: usize,
    ) -> Result<()> {
        if self.peek_ws() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        let mut index = 0usize;
        loop {
            let child = node
                .children
                .iter()
                .find(|(_, i, _)| *i == Some(index))
                .map(|(_, _, n)| n);
            match child {
                Some(child) => self.step(child, at, caps, depth)?,
                None => self.skip()?,
            }
            match self.peek_ws() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(NotJson),
            }
            index += 1;
        }
    }

    /// The value under one matched key or index: a leaf to capture, an events array, one
    /// more event, or a node to walk.
    fn step(
        &mut self,
        node: &Node,
        at: usize,
        caps: &mut Captures<'de>,
        depth: usize,
    ) -> Result<()> {
        if let Some(target) = node.target {
            let raw = self.capture()?;
            caps.events[at].set(target, raw);
            return Ok(());
        }
        if let Some(each) = &node.each {
            return self.each(each, caps, depth);
        }
        if let Some(one) = &node.one {
            // One more event of the batch; dropped again when nothing of it was found
            // (`null`, a scalar, an empty object), so it never counts as an untimed event.
            caps.batch = true;
            caps.events.push(EventCaps::default());
            let at = caps.events.len() - 1;
            self.walk(one, at, caps, depth)?;
            if caps.events[at].is_empty() {
                caps.events.pop();
            }
            return Ok(());
        }
        self.walk(node, at, caps, depth)
    }

    /// An array of events: each element becomes a new event, walked with `node`. Anything
    /// else holds no events (an object's keys are still read as text).
    pub(in crate::extract) fn each(
        &mut self,
        node: &Node,
        caps: &mut Captures<'de>,
        depth: usize,
    ) -> Result<()> {
        match self.peek_ws() {
            Some(b'[') => {
                let depth = self.open(depth)?;
                caps.batch = true;
                if self.peek_ws() == Some(b']') {
                    self.at += 1;
                    return Ok(());
                }
                loop {
                    caps.events.push(EventCaps::default());
                    let at = caps.events.len() - 1;
                    self.walk(node, at, caps, depth)?;
                    match self.peek_ws() {
                        Some(b',') => self.at += 1,
                        Some(b']') => {
                            self.at += 1;
                            return Ok(());
                        }
                        _ => return Err(NotJson),
                    }
                }
            }
            Some(b'{') => {
                self.open(depth)?;
                if self.peek_ws() == Some(b'}') {
                    self.at += 1;
                    return Ok(());
                }
                loop {
                    self.expect(b'"')?;
                    self.text()?;
                    self.expect(b':')?;
                    self.skip()?;
                    match self.peek_ws() {
                        Some(b',') => self.at += 1,
                        Some(b'}') => {
                            self.at += 1;
                            return Ok(());
                        }
                        _ => return Err(NotJson),
                    }
                }
            }
            _ => self.scalar(),
        }
    }
}
