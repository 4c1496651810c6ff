package limiter

import (
	"hash/maphash"
	"sync"
	"time"
)

// denyCache remembers, briefly, the hits Redis denied, so that a client
// hammering a full counter is answered without a store call. It only
// repeats what Redis just denied: a hit on the same key with the same
// limit, bucket and cost (a lighter one might fit), before the wait Redis
// announced. Capacity freed where this instance cannot see (a refund or a
// Reset on another instance) could make an entry wrong, so entries live at
// most maxAge: the error is bounded, and towards denying. A refund through
// this instance drops its counter's entry.
//
// Its times are the limiter's clock (Options.Now), measured from when the
// call was sent, before Redis read its clock: an entry expires no later
// than Redis's own wait, give or take the drift between the clocks.
// (decide.lua's per-call table of denials is no cache: within one call
// Redis TIME does not move, so it repeats a denial exactly.)
//
// Memory is bounded in bytes (an entry counts its key's length plus
// denyEntryOverhead). Entries live in two generations per shard, each at
// most maxAge long: the older one, all expired, is dropped whole when the
// shard is next used (Go maps never shrink), and a full shard drops its
// older generation early, then its newer one. No goroutine is involved.
type denyCache struct {
	maxAge time.Duration
	base   time.Time // times are kept as nanoseconds since base: 8 bytes, not 24
	seed   maphash.Seed
	shards [denyShards]denyShard
}

// denyShards spreads the keys over locks; a hot key still takes one.
const denyShards = 16

// DefaultDenyCacheBytes bounds the memory of the deny cache.
const DefaultDenyCacheBytes = 16 << 20

// denyEntryOverhead is what an entry costs beyond its key's bytes (its map
// slot, the map's spare slots, the key's size class), erring high so that
// the bound holds: TestDenyCacheRetainedBytes measures it.
const denyEntryOverhead = 192

type denyShard struct {
	mu         sync.Mutex
	cur, prev  map[string]denial
	curBytes   int
	prevBytes  int
	curStarted int64 // when cur became the newer generation, since base
	maxBytes   int
}

// denial is a verdict Redis gave. Times are nanoseconds since the cache's base.
type denial struct {
	limit     uint32
	capacity  uint32 // a GCRA bucket's size, else the limit; in what was padding
	cost      uint64
	remaining uint64
	fitsAt    int64 // when the cost fits again, by Redis's own wait
	expires   int64 // when the entry stops answering: fitsAt or maxAge
}

// newDenyCache is a cache whose times come from a clock that reads base
// now: the limiter's (Options.Now).
func newDenyCache(maxAge time.Duration, base time.Time) *denyCache {
	return newDenyCacheAt(maxAge, DefaultDenyCacheBytes, base)
}

// newDenyCacheSized is a cache on the local clock holding maxBytes.
func newDenyCacheSized(maxAge time.Duration, maxBytes int) *denyCache {
	return newDenyCacheAt(maxAge, maxBytes, time.Now())
}

func newDenyCacheAt(maxAge time.Duration, maxBytes int, base time.Time) *denyCache {
	c := &denyCache{maxAge: maxAge, base: base, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].maxBytes = maxBytes / denyShards
	}
	return c
}

func (c *denyCache) since(t time.Time) int64 { return int64(t.Sub(c.base)) }

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%denyShards]
}

// lookup answers h from the cache, if it holds a denial of exactly h.
func (c *denyCache) lookup(h Hit, now time.Time) (Verdict, bool) {
	at := c.since(now)
	s := c.shard(h.Key)
	s.mu.Lock()
	s.age(at, int64(c.maxAge))
	d, ok := s.cur[h.Key]
	if !ok {
		d, ok = s.prev[h.Key]
	}
	s.mu.Unlock()
	if !ok || at >= d.expires || d.limit != h.Limit || d.capacity != h.Capacity() || d.cost != h.Cost {
		return Verdict{}, false
	}
	return Verdict{Remaining: d.remaining, ResetAfter: time.Duration(d.fitsAt - at)}, true
}

// remember keeps a denial decided for a call sent at sent: measuring the
// wait from before Redis ran it, never after, keeps the entry on the safe
// side of Redis's clock.
func (c *denyCache) remember(h Hit, v Verdict, sent time.Time) {
	at := c.since(sent)
	fitsAt := at + int64(v.ResetAfter)
	d := denial{limit: h.Limit, capacity: h.Capacity(), cost: h.Cost, remaining: v.Remaining, fitsAt: fitsAt, expires: min(fitsAt, at+int64(c.maxAge))}
	size := len(h.Key) + denyEntryOverhead
	s := c.shard(h.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.age(at, int64(c.maxAge))
	s.drop(h.Key)
	if size > s.maxBytes {
		return
	}
	if s.curBytes+s.prevBytes+size > s.maxBytes {
		s.rotate(at) // full: the older generation goes first
	}
	if s.curBytes+s.prevBytes+size > s.maxBytes {
		s.prev, s.prevBytes = nil, 0
	}
	if s.cur == nil {
		s.cur = make(map[string]denial)
	}
	s.cur[h.Key] = d
	s.curBytes += size
}

// forget drops what the cache knows of key, so that the next hit on it asks
// Redis: after a Reset or a refund.
func (c *denyCache) forget(key string) {
	s := c.shard(key)
	s.mu.Lock()
	s.drop(key)
	s.mu.Unlock()
}

// age turns the generations over once cur is maxAge old. An entry expires
// within maxAge of its generation's start (its call was sent before the
// insert, which came after this check), so a generation dropped maxAge
// after it stopped being the newer one holds only expired entries.
func (s *denyShard) age(at, maxAge int64) {
	switch {
	case at-s.curStarted >= 2*maxAge:
		s.cur, s.curBytes, s.prev, s.prevBytes = nil, 0, nil, 0
		s.curStarted = at
	case at-s.curStarted >= maxAge:
		s.rotate(at)
	}
}

func (s *denyShard) rotate(at int64) {
	s.prev, s.prevBytes = s.cur, s.curBytes
	s.cur, s.curBytes = nil, 0
	s.curStarted = at
}

// drop deletes key from both generations.
func (s *denyShard) drop(key string) {
	size := len(key) + denyEntryOverhead
	if _, ok := s.cur[key]; ok {
		delete(s.cur, key)
		s.curBytes -= size
	}
	if _, ok := s.prev[key]; ok {
		delete(s.prev, key)
		s.prevBytes -= size
	}
}
