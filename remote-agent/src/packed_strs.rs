//! Many short strings kept in one allocation.
//!
//! The remote agent's stores keep, for every pod and object of every tenant, a handful of short
//! strings: a name, a uid, a resourceVersion, label and annotation keys and values. Each kept
//! as a `Box<str>` is an allocation of its own (rounded up to the allocator's size class) plus a
//! 16-byte pointer, and a pair of them 32 bytes of slice besides: about 60 bytes of overhead a
//! pair for strings of 10 to 40 bytes. [`PackedStrs`] keeps them back to back in one `str`, with
//! where each ends: 4 bytes a string, two allocations in all.

/// Strings kept back to back, read by their index.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct PackedStrs {
    text: Box<str>,
    /// Where each string ends in `text`.
    ends: Box<[u32]>,
}

impl PackedStrs {
    /// The `index`th string; empty past the last.
    pub fn get(&self, index: usize) -> &str {
        let Some(&end) = self.ends.get(index) else {
            return "";
        };
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1],
        };
        &self.text[start as usize..end as usize]
    }

    /// How many strings are kept.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The index of `key` among the `count` strings at `first`, `first + stride`, … (sorted),
    /// found by binary search.
    pub fn find_sorted(
        &self,
        first: usize,
        count: usize,
        stride: usize,
        key: &str,
    ) -> Option<usize> {
        let (mut low, mut high) = (0, count);
        while low < high {
            let mid = low + (high - low) / 2;
            let at = first + stride * mid;
            match self.get(at).cmp(key) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Some(at),
            }
        }
        None
    }

    /// The `count` pairs of strings from index `first` on (key, value, key, value, …).
    pub fn pairs(&self, first: usize, count: usize) -> Pairs<'_> {
        Pairs {
            strings: self,
            first,
            count,
        }
    }
}

/// An object's metadata strings as the remote agent's stores keep them, in one [`PackedStrs`]:
/// `FIXED` strings of the store's own (a name, a resourceVersion, …; empty when absent), then
/// every label's key and value, then every annotation's, then any further strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaStrs<const FIXED: usize> {
    strings: PackedStrs,
    labels: u32,
    annotations: u32,
}

impl<const FIXED: usize> MetaStrs<FIXED> {
    /// Packs `fixed`, the `labels`, the `annotations` and the `rest`, in that order; the
    /// labels and annotations sorted by key, as a `BTreeMap` hands them over.
    pub fn new<'a>(
        fixed: [&'a str; FIXED],
        labels: impl Iterator<Item = (&'a String, &'a String)> + Clone,
        annotations: impl Iterator<Item = (&'a String, &'a String)> + Clone,
        rest: impl Iterator<Item = &'a str>,
    ) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let label_count = count(labels.clone().count());
        let annotation_count = count(annotations.clone().count());
        let pairs = labels
            .chain(annotations)
            .flat_map(|(k, v)| [k.as_str(), v.as_str()]);
        Self {
            strings: fixed.into_iter().chain(pairs).chain(rest).collect(),
            labels: label_count,
            annotations: annotation_count,
        }
    }

    /// The `index`th fixed string (below `FIXED`).
    pub fn fixed(&self, index: usize) -> &str {
        debug_assert!(index < FIXED);
        self.strings.get(index)
    }

    /// Every label, sorted by key.
    pub fn labels(&self) -> Pairs<'_> {
        self.strings.pairs(FIXED, self.labels as usize)
    }

    /// Every annotation, sorted by key.
    pub fn annotations(&self) -> Pairs<'_> {
        let first = FIXED + 2 * self.labels as usize;
        self.strings.pairs(first, self.annotations as usize)
    }

    /// The strings after the annotations.
    pub fn rest(&self) -> impl Iterator<Item = &str> {
        let first = FIXED + 2 * (self.labels as usize + self.annotations as usize);
        (first..self.strings.len()).map(|i| self.strings.get(i))
    }
}

impl<S: AsRef<str>> FromIterator<S> for PackedStrs {
    /// Packs `strings` in order. Metadata is bounded far below 4 GiB (an object is at most a
    /// few MiB), so a `u32` end never overflows; should one, the strings past it are left out
    /// rather than the agent stopping.
    fn from_iter<I: IntoIterator<Item = S>>(strings: I) -> Self {
        let mut text = String::new();
        let mut ends = Vec::new();
        for s in strings {
            text.push_str(s.as_ref());
            let Ok(end) = u32::try_from(text.len()) else {
                text.truncate(ends.last().copied().unwrap_or(0) as usize);
                break;
            };
            ends.push(end);
        }
        Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
        }
    }
}

impl std::fmt::Debug for PackedStrs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries((0..self.len()).map(|i| self.get(i)))
            .finish()
    }
}

/// Key-value pairs within [`PackedStrs`], sorted by key when packed from a sorted map.
#[derive(Clone, Copy)]
pub struct Pairs<'a> {
    strings: &'a PackedStrs,
    first: usize,
    count: usize,
}

impl<'a> Pairs<'a> {
    /// The `i`th pair.
    fn at(&self, i: usize) -> (&'a str, &'a str) {
        let at = self.first + 2 * i;
        (self.strings.get(at), self.strings.get(at + 1))
    }

    /// The value of `key`, found by binary search: the pairs must be sorted by key.
    pub fn get(&self, key: &str) -> Option<&'a str> {
        let at = self.strings.find_sorted(self.first, self.count, 2, key)?;
        Some(self.strings.get(at + 1))
    }

    /// Every pair, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let pairs = *self;
        (0..self.count).map(move |i| pairs.at(i))
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

impl std::fmt::Debug for Pairs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_string_comes_back_by_index_empty_ones_too() {
        let packed: PackedStrs = ["web", "", "ns", "ünïcode"].into_iter().collect();
        assert_eq!(packed.len(), 4);
        assert_eq!(
            (0..5).map(|i| packed.get(i)).collect::<Vec<_>>(),
            ["web", "", "ns", "ünïcode", ""],
            "past the last is empty"
        );
        let none: PackedStrs = std::iter::empty::<&str>().collect();
        assert_eq!(none.len(), 0);
        assert_eq!(none.get(0), "");
    }

    #[test]
    fn metadata_keeps_each_section_apart() {
        use std::collections::BTreeMap;
        let labels = BTreeMap::from([("a".to_string(), "1".to_string())]);
        let annotations = BTreeMap::from([
            ("a".to_string(), "note".to_string()),
            ("b".to_string(), "2".to_string()),
        ]);
        let meta = MetaStrs::new(
            ["web", ""],
            labels.iter(),
            annotations.iter(),
            ["x", "y"].into_iter(),
        );
        assert_eq!((meta.fixed(0), meta.fixed(1)), ("web", ""));
        assert_eq!(meta.labels().iter().collect::<Vec<_>>(), [("a", "1")]);
        assert_eq!(
            meta.annotations().get("a"),
            Some("note"),
            "its own, not the label"
        );
        assert_eq!(meta.annotations().get("b"), Some("2"));
        assert_eq!(meta.rest().collect::<Vec<_>>(), ["x", "y"]);
        let bare: MetaStrs<1> = MetaStrs::new(
            [""],
            labels.iter().take(0),
            labels.iter().take(0),
            std::iter::empty(),
        );
        assert!(bare.labels().is_empty() && bare.annotations().is_empty());
        assert_eq!(bare.rest().count(), 0);
    }

    #[test]
    fn sorted_pairs_are_found_by_key_and_listed_in_order() {
        let packed: PackedStrs = ["name", "a", "1", "b", "2", "c", "3", "x", "9"]
            .into_iter()
            .collect();
        let pairs = packed.pairs(1, 3);
        assert_eq!(
            ["a", "b", "c", "d", "", "x", "name"].map(|k| pairs.get(k)),
            [Some("1"), Some("2"), Some("3"), None, None, None, None],
            "only the pairs' own keys, not the strings around them"
        );
        assert_eq!(
            pairs.iter().collect::<Vec<_>>(),
            [("a", "1"), ("b", "2"), ("c", "3")]
        );
        assert_eq!(packed.pairs(7, 1).get("x"), Some("9"));
        assert!(packed.pairs(1, 0).is_empty());
        assert_eq!(packed.pairs(1, 0).get("a"), None);
    }
}
