package config

import (
	"slices"
	"strings"
)

// BucketEntry is one entry of an RLQS bucket id, in descriptor order. It
// satisfies Entry, so that Match takes the entries BucketEntries returns.
type BucketEntry struct{ Key, Value string }

// GetKey returns the entry's key.
func (e BucketEntry) GetKey() string { return e.Key }

// GetValue returns the entry's value.
func (e BucketEntry) GetValue() string { return e.Value }

// BucketEntries orders an RLQS bucket id (a map of keys to values, which
// says nothing of order) as the descriptor entries domain's tree nests, so
// that Match(c, domain, entries) gives the rule, and the limiter the
// counter, that ShouldRateLimit gives a descriptor with those entries.
//
// The walk is greedy from the domain's root: at each level, of the keys not
// yet placed that the level names, in byte order, the first whose value
// finds a node (exact, then wildcard, then key-only, as Match) is placed and
// the walk descends to that node's children. It never backtracks, so it
// takes at most len(bucket) levels. ok is false when a key is left that the
// level reached does not place, when domain is unknown, or when bucket is
// empty (no entries: no rule, as an empty descriptor). ok true does not
// mean a rule: the node reached may have no rate_limit. The returned slice
// is its only allocation.
func BucketEntries(c *Config, domain string, bucket map[string]string) ([]BucketEntry, bool) {
	lvl := c.domains[domain]
	if lvl == nil || len(bucket) == 0 {
		return nil, false
	}
	entries := make([]BucketEntry, 0, len(bucket))
	for k, v := range bucket {
		entries = append(entries, BucketEntry{k, v})
	}
	slices.SortFunc(entries, func(a, b BucketEntry) int { return strings.Compare(a.Key, b.Key) })
	// entries[:placed] are in descriptor order; the rest stay in byte order.
	for placed := range entries {
		if lvl == nil { // a leaf reached with keys left
			return nil, false
		}
		next := -1
		for i := placed; i < len(entries) && next < 0; i++ {
			if n := lvl.lookup(entries[i].Key, entries[i].Value); n != nil {
				next, lvl = i, n.children
			}
		}
		if next < 0 {
			return nil, false
		}
		e := entries[next]
		copy(entries[placed+1:next+1], entries[placed:next])
		entries[placed] = e
	}
	return entries, true
}
