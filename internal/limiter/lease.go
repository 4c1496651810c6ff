package limiter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Leases: a charge of the sliding window log that names itself (Hit.Lease).
// A lease id is "<units>.<nonce>": the units the lease took, in decimal, and
// 128 random bits in 32 lowercase hex digits. The store names the lease's
// members by the nonce alone, so settling another caller's lease takes
// guessing its nonce; the units only say how many members to look for (a
// wrong number frees fewer of the caller's own). Ids are ASCII, 34 to 43
// bytes: a descriptor entry's value as it is.

// nonceBytes is a lease nonce's size: 128 bits.
const nonceBytes = 16

// errLeaseAlgorithm refuses a lease or a settlement on an algorithm other
// than the log, the one whose units have names.
var errLeaseAlgorithm = errors.New("leases need algorithm " + config.SlidingWindowLog.String())

// newNonce returns a fresh lease nonce, 32 hex digits.
func newNonce() string {
	var b [nonceBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24 and later)
	return hex.EncodeToString(b[:])
}

// leaseID is the id of a lease of units named by nonce.
func leaseID(units uint64, nonce string) string {
	return strconv.FormatUint(units, 10) + "." + nonce
}

// parseLease reads a lease id. Whatever a client sent may arrive here: ok
// is false for anything that is not an id's form, which then names no lease.
func parseLease(id string) (nonce string, units uint64, ok bool) {
	u, n, found := strings.Cut(id, ".")
	if !found || len(n) != 2*nonceBytes {
		return "", 0, false
	}
	for _, c := range []byte(n) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", 0, false
		}
	}
	units, err := strconv.ParseUint(u, 10, 64)
	if err != nil || units == 0 {
		return "", 0, false
	}
	return n, units, true
}

// leaseBase is the base name of the members of the lease id names, the
// token refund.lua undoes them by.
func leaseBase(id string) string {
	nonce, _, _ := parseLease(id)
	return "L" + nonce
}

// checkLeases refuses leases and settlements on algorithms other than the
// log, before anything is sent.
func checkLeases(hits []Hit) error {
	for i := range hits {
		h := &hits[i]
		if (h.Lease || h.Settle != "") && h.Algorithm != config.SlidingWindowLog {
			return fmt.Errorf("%w, not %v", errLeaseAlgorithm, h.Algorithm)
		}
		if !h.Lease {
			continue
		}
		// One kind per hit (Hit.op), and hits on one key are one demand:
		// a lease is no cost already spent, nor one demand with one.
		for j := range hits {
			if hits[j].Record && hits[j].Key == h.Key {
				return errLeaseRecord
			}
		}
	}
	return nil
}

var errLeaseRecord = errors.New("a lease is no recorded cost (Record), nor shares its key with one")

// leaseTTL is how long a lease of h lives unsettled, in whole milliseconds
// (at least one): LeaseTTL, at most the window (a lease scored after now
// would make the log place a later charge after it, past its window).
func (h *Hit) leaseTTL() int64 {
	ttl := h.LeaseTTL
	if ttl <= 0 || ttl > h.Window {
		ttl = h.Window
	}
	return max(1, int64((ttl+time.Millisecond-1)/time.Millisecond))
}

// leaseArg appends to a log hit's decide.lua argument (which ends at its
// cost) a lease's ":::<ttl ms>:<nonce>", whose nonce it draws and returns,
// or a settlement's ":::<units reserved>:<nonce>" (empty for an id that is
// not one, which names no lease).
func leaseArg(arg string, h *Hit) (string, string) {
	if h.Lease {
		nonce := newNonce()
		return arg + ":::" + strconv.FormatInt(h.leaseTTL(), 10) + ":" + nonce, nonce
	}
	nonce, units, ok := parseLease(h.Settle)
	if !ok {
		return arg + ":::0:", ""
	}
	return arg + ":::" + strconv.FormatUint(units, 10) + ":" + nonce, nonce
}

// partArg appends to the decide.lua argument of a log charge made as a
// part of a request (of two stores' or several Cluster slots'), which ends
// at its cost, "::::<nonce>", and returns the nonce, which names its
// members for its give-back alone: named by their score only, a client's
// refund in between could take them and free their name for a later
// charge of the same microsecond, which the give-back would then take. A
// charge on the reference's keys that may be given back asks instead for
// its key's life as its token ("::::1"; reference_fixed_window.lua).
func partArg(arg string, h *Hit) (string, string) {
	op := h.op()
	if h.Cost == 0 || !op.Charges || op.Record || op.AppliedFirst {
		return arg, ""
	}
	if h.Algorithm.ReferenceKeys() {
		return arg + "::::1", ""
	}
	if h.Algorithm != config.SlidingWindowLog || h.Ahead > 0 {
		return arg, ""
	}
	nonce := fmt.Sprintf("%s%012x", partPrefix, partCount.Add(1))
	return arg + "::::" + nonce, nonce
}

// A part's nonce is unique, not secret: this process's random prefix, then
// a count in fixed width, so that parts at one score sort in the order they
// were charged, and a refund takes the same ones in every replay.
var (
	partPrefix = fmt.Sprintf("%08x", mathrand.Uint32())
	partCount  atomic.Uint64
)

// partName is the base name of the members of a part's charge (partArg):
// its score, "p", its nonce.
func partName(token int64, nonce string) string {
	return strconv.FormatInt(token, 10) + "p" + nonce
}

// givesBack reports a hit that is applied whatever its request's fate and
// never denies it: a refund, or a lease's settlement.
func (h *Hit) givesBack() bool { return h.op().AppliedFirst }

// orphanedLeases returns the orphan handler (call.orphan) of a decide call
// of the hits at indexes group whose leases have the nonces given (by index
// in group, "" for no lease). A caller that stopped waiting never hears of
// the leases its call took (Envoy answered by its failure mode, and no
// stream-done call will name them), which would hold their seats until
// their TTL. The handler awaits the call's answer in the background and
// settles every lease it took; after an error with which the call may have
// run, every lease it asked for (a settlement frees only what its nonce
// names). It copies what it needs of the hits when called, before the
// caller returns.
func (l *Limiter) orphanedLeases(hits []Hit, group []int, nonces []string) func(<-chan outcome) {
	return func(done <-chan outcome) {
		var leased []Hit
		var at []int // of each leased hit, its place in the call's reply
		for j, i := range group {
			if nonces[j] != "" {
				leased = append(leased, hits[i])
				at = append(at, j)
			}
		}
		l.refunds.Go(func() {
			o := <-done
			if errors.Is(o.err, ErrOverloaded) {
				return // never sent
			}
			verdicts := make([]Verdict, len(leased))
			back := make([]bool, len(leased))
			var taken []int
			for k, h := range leased {
				if o.err == nil && o.vals[4*at[k]]&3 != 2 { // not admitted and charged: no lease
					continue
				}
				verdicts[k] = Verdict{Admitted: true, Charged: true, Lease: leaseID(min(h.Cost, uint64(h.Limit)), nonces[at[k]])}
				back[k] = true
				taken = append(taken, k)
			}
			if taken != nil {
				l.refund(context.Background(), "settlement of leases whose answer came too late",
					leased, [][]int{taken}, verdicts, make([]int64, len(leased)), back)
			}
		})
	}
}
