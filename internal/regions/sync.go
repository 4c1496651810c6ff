package regions

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/slidingwindow/ratelimit/internal/fairshare"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Suffixes of a global counter's key: its region's record on the region's
// store, its registry on the ledger.
const (
	recordSuffix   = ":region"
	registrySuffix = ":ledger"
)

// demandWeight is the weight of the last Refresh's rate in an instance's
// demand: about a second's memory at the default Refresh.
const demandWeight = 0.25

// syncEvery syncs the keys every Refresh until Close.
func (r *Regions) syncEvery() {
	defer r.work.Done()
	tick := time.NewTicker(r.o.Refresh)
	defer tick.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-tick.C:
		}
		r.syncAll()
	}
}

// syncAll syncs every key seen within two leases with its region's record,
// at once (the store's batcher sends them together). A key idle longer is
// forgotten: its grant lapses unless another instance of the region renews
// it, and the ledger keeps reserving what the region counted for a window
// after (its next hit here starts within the floor, and sees the region's
// grant at the next sync).
func (r *Regions) syncAll() {
	now := r.now()
	type job struct {
		k   *globalKey
		req recordSync
	}
	var jobs []job
	var states KeyStates
	r.mu.Lock()
	for key, k := range r.keys {
		if now.Sub(k.seen) > 2*r.o.Lease {
			delete(r.keys, key)
			continue
		}
		switch {
		case now.Before(k.leaseEnd):
			states.Held++
		case k.held:
			states.Cut++
		default:
			states.Waiting++
		}
		states.Allowance += uint64(k.allowance(now))
		elapsed := r.o.Refresh
		if !k.synced.IsZero() {
			elapsed = max(now.Sub(k.synced), time.Millisecond)
		}
		asked := k.units / elapsed.Seconds() * k.hit.Window.Seconds()
		if k.synced.IsZero() {
			k.demand = asked
		} else {
			k.demand += demandWeight * (asked - k.demand)
		}
		k.units = 0
		jobs = append(jobs, job{k, r.syncRequest(k)})
	}
	r.mu.Unlock()
	if r.o.Observe.Keys != nil {
		r.o.Observe.Keys(states)
	}
	if r.inline {
		slices.SortFunc(jobs, func(a, b job) int { return strings.Compare(a.req.Key, b.req.Key) })
		for _, j := range jobs {
			r.sync(j.k, j.req)
		}
		return
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.sync(j.k, j.req)
		}()
	}
	wg.Wait()
}

// syncRequest is k's sync with its region's record. The caller holds r.mu.
func (r *Regions) syncRequest(k *globalKey) recordSync {
	return recordSync{
		Key: k.hit.Key + recordSuffix, Instance: r.o.Instance, Demand: k.demand,
		DemandTTL: 4 * r.o.Refresh, RenewAhead: r.o.Lease / 2, RenewTTL: r.o.Lease / 4,
	}
}

// sync runs req and takes in its answer; the instance asked to renew
// renews, in the background.
func (r *Regions) sync(k *globalKey, req recordSync) {
	sent := r.now()
	st, err := syncRecord(context.Background(), r.o.Local, req)
	if err != nil {
		return // the region's store failed: its hits fail over as any
	}
	r.apply(k, st, sent)
	if !st.Renew {
		return
	}
	r.mu.Lock()
	if k.renewing {
		r.mu.Unlock()
		return
	}
	k.renewing = true
	r.mu.Unlock()
	if r.inline {
		r.renew(k, st, req)
		r.mu.Lock()
		k.renewing = false
		r.mu.Unlock()
		return
	}
	r.work.Add(1)
	go func() {
		defer r.work.Done()
		r.renew(k, st, req)
		r.mu.Lock()
		k.renewing = false
		r.mu.Unlock()
	}()
}

// apply takes in the region's record of k as answered to a sync sent at
// sent: the lease is taken to end its time left after the sending, early.
func (r *Regions) apply(k *globalKey, st recordState, sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k.synced, k.grant, k.leaseEnd = sent, st.Grant, time.Time{}
	if st.LeaseLeft > 0 {
		k.leaseEnd, k.held = sent.Add(st.LeaseLeft), true
	}
}

// renew asks the ledger for the region's grant of k, with the region's
// demand and count and the grant it decides with, in the turn st gave, and
// writes the answer to the region's record. A renewal that fails gives its
// turn up: the next sync renews (a turn is a quarter of a lease, begun
// when half of it is left, so a lease sees two at least).
func (r *Regions) renew(k *globalKey, st recordState, req recordSync) {
	ctx := context.Background()
	req.Set, req.Turn = true, st.Turn
	release := func() {
		req.Release = true
		_, _ = syncRecord(ctx, r.o.Local, req) // failing too, the turn ends on its own
	}
	r.mu.Lock()
	check := k.hit
	floor := k.floor()
	r.mu.Unlock()
	verdicts, err := r.counts.Decide(ctx, []limiter.Hit{check})
	if err != nil || len(verdicts) != 1 || verdicts[0].FailureVerdict {
		release() // the region's count is unknown: no grant can be reserved for it
		return
	}
	var count uint64
	if limit := uint64(check.Limit); verdicts[0].Remaining < limit {
		count = limit - verdicts[0].Remaining
	}
	var current uint64
	if st.LeaseLeft > 0 {
		current = st.Grant
	}
	sent := r.now()
	g, err := fairshare.Allow(ctx, r.o.Ledger, fairshare.AllowanceRequest{
		Key: check.Key + registrySuffix, Region: r.o.Region, Demand: st.Demand, Count: count, Current: current,
		Limit: uint64(check.Limit), Window: check.Window, Lease: r.o.Lease, Floor: floor, Regions: r.o.Regions, Turn: st.Turn,
	})
	took := r.now().Sub(sent)
	if err != nil {
		if r.o.Observe.LedgerFailed != nil {
			r.o.Observe.LedgerFailed(err, took)
		}
		release()
		return
	}
	if r.o.Observe.Renewed != nil {
		r.o.Observe.Renewed(g.Units, took)
	}
	// The ledger's lease started after sent: what is left of it counts from
	// the sending of the write.
	setSent := r.now()
	left := r.o.Lease - setSent.Sub(sent)
	if left <= 0 {
		release()
		return
	}
	req.Grant, req.Lease = g.Units, left
	st2, err := syncRecord(ctx, r.o.Local, req)
	if err != nil {
		return
	}
	r.apply(k, st2, setSent)
}
