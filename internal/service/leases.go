package service

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// Leases (a rule with leases: true; docs/budgets.md): an admitted
// acquisition is answered with its lease id in dynamic_metadata, and the
// stream-done call sends it back as the last entry of its descriptor, under
// LeaseKey, with the actual cost in the descriptor's own hits_addend (none,
// or is_negative_hits: 0, a seat given back).

// LeaseKey is the key of the descriptor entry that carries a lease id back
// (Envoy's metadata rate limit action's descriptor_key): a descriptor whose
// last entry has this key, and whose other entries match a rule with
// leases, settles that rule's lease. A descriptor that matches a rule with
// its lease entry included is that rule's, as before leases.
const LeaseKey = "lease"

// LeasesField is the field of an answer's dynamic_metadata that holds the
// lease ids of its admitted acquisitions, each under its rule's name, or,
// for a rule without one, its descriptor's first entry's key. Envoy's
// filter stores the answer's dynamic_metadata under the namespace
// envoy.filters.http.ratelimit: a metadata action reads an id at the path
// [leases, <name>].
const LeasesField = "leases"

// resolveSettlement finds the rule a lease's settlement goes to: d without
// its last entry, which carries the lease id under LeaseKey, matched to a
// rule with leases; a limit override it carries changes nothing (a lease is
// never taken under one). It returns nil for any other descriptor, and for
// one a rule matches whole, lease entry included.
func resolveSettlement(cfg *config.Config, domain string, d *rlcommon.RateLimitDescriptor) *limit {
	n := len(d.Entries)
	if n < 2 || d.Entries[n-1].Key != LeaseKey || config.Match(cfg, domain, d.Entries) != nil {
		return nil
	}
	rule := config.Match(cfg, domain, d.Entries[:n-1])
	if rule == nil || !rule.Leases || rule.Unlimited {
		return nil
	}
	l := ruleLimit(rule)
	l.settling = true
	return l
}

// leaseHit makes h, a hit of a rule with leases for descriptor d, a lease
// or a settlement. A settlement's cost is the actual cost: the descriptor's
// own hits_addend, 0 without one or with is_negative_hits (a seat given
// back). A refund that names no lease frees nothing: a lease is freed by its
// id alone. A check (cost 0) stays a check.
func (l *limit) leaseHit(h *limiter.Hit, d *rlcommon.RateLimitDescriptor) {
	h.Record, h.Refund = false, false
	switch {
	case l.settling:
		h.Settle = d.Entries[len(d.Entries)-1].Value
		h.Cost = 0
		if d.HitsAddend != nil && !d.IsNegativeHits {
			h.Cost = d.HitsAddend.Value
		}
	case d.IsNegativeHits:
		h.Settle, h.Cost = noLease, 0
	case h.Cost > 0:
		h.Lease = true
		if l.rule != nil {
			h.LeaseTTL = l.rule.LeaseTTL
		}
	}
	if h.Settle == "" && l.settling {
		h.Settle = noLease // an empty value names no lease, and is a settlement all the same
	}
}

// noLease is a settlement's id that names no lease.
const noLease = "-"

// leaseMetadata adds the lease ids of an answer's admitted acquisitions to
// its dynamic_metadata, under LeasesField. A denied request gets none (no
// lease was taken): Envoy stores an OVER_LIMIT answer's metadata too, and
// its stream-done descriptor must find no id, so that it sends nothing.
func leaseMetadata(resp *rlsv3.RateLimitResponse, req *rlsv3.RateLimitRequest, limits []*limit, verdicts []limiter.Verdict) {
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		return
	}
	var ids map[string]*structpb.Value
	for i, l := range limits {
		if l == nil || l.hit < 0 || l.hit >= len(verdicts) || verdicts[l.hit].Lease == "" {
			continue
		}
		name := l.name
		if name == "" {
			name = req.Descriptors[i].Entries[0].Key
		}
		if ids == nil {
			ids = map[string]*structpb.Value{}
		}
		if _, taken := ids[name]; !taken {
			ids[name] = structpb.NewStringValue(verdicts[l.hit].Lease)
		}
	}
	if ids == nil {
		return
	}
	if resp.DynamicMetadata == nil {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{}}
	}
	resp.DynamicMetadata.Fields[LeasesField] = structpb.NewStructValue(&structpb.Struct{Fields: ids})
}
