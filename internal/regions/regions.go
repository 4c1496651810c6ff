// Package regions decides the global rules (config.Global): one limit
// across regions, each region with its own store. A global rule's hit is
// decided on the region's store, as any hit, with the region's allowance
// as its limit: its floor (the rule's regional share of the limit,
// reserved for every region) plus the grant the region holds from the
// ledger, a store every region reaches (fairshare.Allow). The request
// path touches only the region's store; the grants are kept in the
// background. Every Refresh, each instance syncs each global key it saw
// with its region's record on the region's store (its demand in, the
// region's grant out: syncRecord), and one instance of the region
// at a time renews the grant from the ledger when its lease ends within
// half a lease. A key's first hits in an instance, before it has seen a
// grant, are decided within the floor; a region cut from the ledger
// decides with what it holds until its lease ends, then as the rule's
// when_cut says. It knows nothing of gRPC. See docs/regions.md.
package regions

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Defaults where Options leave a field zero.
const (
	// DefaultLease is how long a grant lives on the ledger: renewed at half
	// of it, a grant outlives a renewal lost to a slow ledger or a lost
	// answer.
	DefaultLease = 4 * time.Second
	// DefaultRefresh is how often an instance syncs a key with its
	// region's record: how soon it sees a new grant, and how soon the
	// region sees its demand.
	DefaultRefresh = 250 * time.Millisecond
)

// Options configure Regions. Region, Regions, Ledger and Local are
// required.
type Options struct {
	// Region is this instance's region.
	Region string
	// Regions is how many regions share each global limit.
	Regions int
	// Instance names this instance among its region's; empty means a
	// random name.
	Instance string
	// Ledger is the store every region reaches.
	Ledger *limiter.Limiter
	// Local is the region's store, where its record of each key's grant
	// lives.
	Local *limiter.Limiter
	// Counts reads a key's count on the region's store (a check of cost
	// 0): the store's decider without slices. Nil means Local.
	Counts decision.Store
	// Lease, Refresh: see DefaultLease and DefaultRefresh. Refresh must be
	// under a quarter of Lease: an instance sees a grant before the
	// region's next renewal (see fairshare.Allow's Current).
	Lease, Refresh time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Observe is told of what happens, for metrics; nil fields are skipped.
	Observe Observe
}

// Observe receives the events of Regions.
type Observe struct {
	// Renewed is told of each answer of the ledger: the grant (past the
	// floor), and how long the call took.
	Renewed func(grant uint64, took time.Duration)
	// LedgerFailed is told of each failed call to the ledger.
	LedgerFailed func(err error, took time.Duration)
	// Keys is told, every Refresh, of the global keys this instance
	// decides.
	Keys func(KeyStates)
}

// KeyStates counts the global keys an instance decides by state, and sums
// their allowances.
type KeyStates struct {
	Held    int // a grant lives
	Cut     int // a grant ended unrenewed: when_cut decides
	Waiting int // no grant seen yet: the floor decides
	// Allowance sums the limits the keys are decided with now.
	Allowance uint64
}

// Regions decides the hits of global rules within their regions'
// allowances and keeps the allowances; other hits pass through.
type Regions struct {
	inner  decision.Decider
	counts decision.Store
	o      Options
	now    func() time.Time

	mu   sync.Mutex
	keys map[string]*globalKey

	stop chan struct{}
	work sync.WaitGroup
	// inline runs the syncs one after another and a renewal within its
	// sync: the simulator's schedules replay exactly.
	inline bool
}

// globalKey is what this instance knows of a global counter.
type globalKey struct {
	hit      limiter.Hit // the rule's: Limit is the global limit, Cost 0
	global   config.Global
	seen     time.Time // its last hit here
	units    float64   // units asked here since the last sync
	demand   float64   // units per window asked here, smoothed
	synced   time.Time // the last sync
	grant    uint64
	leaseEnd time.Time // by this instance's clock, early
	held     bool      // a grant was seen live: once it ends, the region is cut
	renewing bool
}

// New returns Regions deciding through inner, started: call Close to stop.
func New(inner decision.Decider, o Options) (*Regions, error) {
	r, err := newRegions(inner, o)
	if err != nil {
		return nil, err
	}
	r.work.Add(1)
	go r.syncEvery()
	return r, nil
}

// newRegions returns Regions with its options checked and filled, not
// started.
func newRegions(inner decision.Decider, o Options) (*Regions, error) {
	switch {
	case o.Region == "":
		return nil, errors.New("regions: no region named")
	case o.Regions < 1:
		return nil, errors.New("regions: no regions")
	case o.Ledger == nil || o.Local == nil:
		return nil, errors.New("regions: a ledger and a regional store are both needed")
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.Refresh <= 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Refresh > o.Lease/4 {
		return nil, errors.New("regions: refresh longer than a quarter of the lease")
	}
	if o.Instance == "" {
		var b [6]byte
		_, _ = rand.Read(b[:]) // crypto/rand never fails on supported platforms
		o.Instance = hex.EncodeToString(b[:])
	}
	r := &Regions{inner: inner, counts: o.Counts, o: o, now: o.Now, keys: map[string]*globalKey{}, stop: make(chan struct{})}
	if r.counts == nil {
		r.counts = o.Local
	}
	if r.now == nil {
		r.now = time.Now
	}
	return r, nil
}

// Close stops the syncs and renewals and waits for them.
func (r *Regions) Close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.work.Wait()
}

// Decide decides hits through the inner decider, each hit of a global rule
// with its region's allowance as its limit and no slice (the allowance
// moves; a slice would hold units of an older one).
func (r *Regions) Decide(ctx context.Context, req decision.Request) ([]limiter.Verdict, error) {
	global := -1
	for i := range req.Routes {
		if req.Routes[i].Global != nil {
			global = i
			break
		}
	}
	if global < 0 {
		return r.inner.Decide(ctx, req)
	}
	req = decision.Request{Hits: slices.Clone(req.Hits), Routes: slices.Clone(req.Routes)}
	now := r.now()
	r.mu.Lock()
	for i := global; i < len(req.Hits); i++ {
		h, route := &req.Hits[i], &req.Routes[i]
		if route.Global == nil {
			continue
		}
		k := r.keys[h.Key]
		if k == nil {
			k = &globalKey{}
			r.keys[h.Key] = k
		}
		// The rule as this hit has it: a reload or a limit override may
		// change it.
		k.hit, k.global = *h, *route.Global
		k.hit.Cost = 0
		k.seen = now
		k.units += float64(h.Cost)
		h.Limit = k.allowance(now)
		*route = decision.Route{NoSlices: true}
	}
	r.mu.Unlock()
	return r.inner.Decide(ctx, req)
}

// floor is the units every region keeps of k's limit.
func (k *globalKey) floor() uint64 {
	return uint64(math.Floor(k.global.Share * float64(k.hit.Limit)))
}

// allowance is k's limit in this region at now: the floor and the grant
// while its lease lives; the floor until a grant was seen; once a grant
// ended unrenewed (the region cut from the ledger), as when_cut says.
func (k *globalKey) allowance(now time.Time) uint32 {
	floor := k.floor()
	switch {
	case now.Before(k.leaseEnd):
		return uint32(min(floor+k.grant, uint64(k.hit.Limit)))
	case !k.held || k.global.WhenCut == config.CutShare:
		return uint32(floor)
	case k.global.WhenCut == config.CutFailureMode && k.hit.FailureMode == config.FailureAllow:
		return k.hit.Limit // as a region alone
	default:
		return 0
	}
}
