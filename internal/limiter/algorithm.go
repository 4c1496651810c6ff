package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/slidingwindow/ratelimit/internal/algorithm"
	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// An algorithm's description comes from internal/algorithm's table, by
// config.Algorithm's ID. Nothing here names an algorithm.

// errUnknownAlgorithm refuses a hit whose algorithm the Lua does not
// implement: only the zero Algorithm, or a value made up, can be one.
var errUnknownAlgorithm = errors.New("unknown algorithm")

// describe returns the description of a, or an error wrapping
// errUnknownAlgorithm.
func describe(a config.Algorithm) (*algorithm.Descriptor, error) {
	d, ok := algorithm.ByID(int(a))
	if !ok {
		return nil, fmt.Errorf("%w %v", errUnknownAlgorithm, a)
	}
	return d, nil
}

// errCalendar refuses a hit aligned to the calendar whose algorithm is not
// fixed_window, the one algorithm with edges to align (config.CalendarOf).
var errCalendar = errors.New("a calendar window for an algorithm other than fixed_window")

// checkAlgorithms refuses, before anything is sent, a hit whose algorithm
// is unknown or has a calendar it cannot follow.
func checkAlgorithms(hits []Hit) error {
	for i := range hits {
		if _, err := describe(hits[i].Algorithm); err != nil {
			return err
		}
		if !hits[i].Calendar.IsZero() && hits[i].Algorithm != config.FixedWindow {
			return fmt.Errorf("%w: %v", errCalendar, hits[i].Algorithm)
		}
	}
	return nil
}

// op is the kind of operation h asks of its counter (lua.Ops), from its
// fields: a settlement, a refund, a lease, a record (conditional for an
// RLQS fleet's lease), else a charge (a cost of 0 only checks).
func (h *Hit) op() lua.Op {
	switch {
	case h.Settle != "":
		return opSettle
	case h.Refund:
		return opRefund
	case h.Lease:
		return opLease
	case h.Record && h.RecordIfAlone:
		return opRecordIfAlone
	case h.Record:
		return opRecord
	case h.RecordIfAlone: // an RLQS lease decided as a charge
		return opBucketLease
	}
	return opCharge
}

// The kinds of operation a Hit can be, described once.
var (
	opCharge, opRecord, opRecordIfAlone = lua.OpOf(lua.OpCharge), lua.OpOf(lua.OpRecord), lua.OpOf(lua.OpRecordIfAlone)
	opRefund, opLease, opSettle         = lua.OpOf(lua.OpRefund), lua.OpOf(lua.OpLease), lua.OpOf(lua.OpSettle)
	opBucketLease                       = lua.OpOf(lua.OpBucketLease)
)

// appendRole appends h's role in its request's rule (lua.RoleEnforced and
// the others): a quota hit's with its group, and over when quotas (the
// request's rule before the store) has its quota over. With quotas nil, a
// quota hit goes as a shadow hit.
func appendRole(s []byte, h *Hit, quotas *requestRule) []byte {
	switch {
	case h.quota() && quotas != nil:
		role := byte(lua.RoleQuota)
		if quotas.quotaOver(h.QuotaGroup) {
			role = lua.RoleQuotaOver
		}
		return strconv.AppendUint(append(s, role), uint64(h.QuotaGroup), 10)
	case h.Shadow, h.quota():
		return append(s, lua.RoleShadow)
	}
	return append(s, lua.RoleEnforced)
}

// hitArg is the hit's argument to decide.lua (its header says the layout):
// one string per hit costs Redis less than several numbers, and decide.lua
// parses each distinct string once. A calendar's window is the edges of
// the windows around now (config.Calendar.Edges), of which the script
// picks the one holding Redis TIME.
func hitArg(h *Hit, quotas *requestRule, now time.Time) (string, error) {
	d, err := describe(h.Algorithm)
	if err != nil {
		return "", err
	}
	var b [96]byte
	s := strconv.AppendInt(b[:0], int64(d.ID), 10)
	s = append(s, ':', h.op().Letter)
	s = appendRole(s, h, quotas)
	s = append(s, ':')
	s = strconv.AppendUint(s, uint64(h.Limit), 10)
	s = append(s, ':')
	if h.Calendar.IsZero() {
		s = strconv.AppendInt(s, int64(h.Window/time.Second), 10)
	} else {
		for i, edge := range h.Calendar.Edges(now) {
			if i > 0 {
				s = append(s, ',')
			}
			s = strconv.AppendInt(s, edge.Unix(), 10)
		}
	}
	s = append(s, ':')
	s = strconv.AppendUint(s, luaCost(h, d), 10)
	ahead := h.Ahead > 0 && !h.Algorithm.ReferenceKeys() // the reference's keys hold no slice (recordsSlices)
	if d.Bucket || ahead {
		s = append(s, ':')
	}
	if d.Bucket {
		s = strconv.AppendUint(s, uint64(h.burst()), 10)
	}
	if ahead {
		s = append(s, ':')
		s = strconv.AppendInt(s, int64((h.Ahead+time.Millisecond-1)/time.Millisecond), 10)
	}
	return string(s), nil
}

// luaCost is a hit's cost for decide.lua, at most what its algorithm's Lua
// is exact for: no counter holds more.
func luaCost(h *Hit, d *algorithm.Descriptor) uint64 { return min(h.Cost, d.MaxCost) }

// refundArgs appends refund.lua's arguments for a charge of h that token
// names: its algorithm's ID, token, cost, limit and window in seconds.
func refundArgs(args []any, h *Hit, token any) ([]any, error) {
	d, err := describe(h.Algorithm)
	if err != nil {
		return args, err
	}
	return append(args, d.ID, token, h.Cost, h.Limit, int64(h.Window/time.Second)), nil
}

// quota reports a quota hit: Quota, not Shadow, and not a refund, which
// never denies.
func (h *Hit) quota() bool { return h.Quota && !h.Shadow && !h.givesBack() }

// burst is the size of a bucket hit's bucket: Burst, or Limit when unset.
func (h *Hit) burst() uint32 {
	if h.Burst == 0 {
		return h.Limit
	}
	return h.Burst
}

// Capacity is the most units the hit's counter ever holds: a bucket's size,
// else the limit (also for an unknown algorithm, which is never decided).
func (h *Hit) Capacity() uint32 {
	if h.Algorithm.Bucket() {
		return h.burst()
	}
	return h.Limit
}

// windowLeft is how long the window holding now lasts, by the limiter's
// clock: a calendar window's end (months and weeks differ in length), else
// a whole window, which is what a cost that never fits waits at most.
func (h *Hit) windowLeft(now time.Time) time.Duration {
	if h.Calendar.IsZero() {
		return h.Window
	}
	return h.Calendar.Edges(now)[2].Sub(now)
}
