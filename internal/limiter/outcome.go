package limiter

// What denies a request, decided in one place. Go applies the rule here;
// decide.lua's check loop applies its twin atomically on Redis, where a
// request's charges depend on it. A change to one is a change to the
// other: TestRequestRuleTwins checks them against each other.
//
// Per hit, by its flags (see Hit):
//   - a Refund never denies: it is applied whatever the request's fate;
//   - a Shadow hit never denies (Shadow wins over Quota);
//   - the Quota hits of one QuotaGroup are one quota, over when any of them
//     does not fit; a quota denies only together with the request's other
//     quotas: a request that has quotas needs at least one of them whole;
//   - any other hit, a Record hit included, denies its request when it does
//     not fit.
//
// A request that the rule denies is charged nothing, but for its Record hits
// (a cost already spent) and its refunds; nor is a quota that is over, but
// for its Record hits. The service's global modes (SHADOW_MODE, QUOTA_MODE)
// reach the rule only as these per-hit flags.

// requestRule tallies a request's hits under the rule; the zero value is a
// request with no hits, which is not denied.
type requestRule struct {
	enforcedDenied bool         // a hit that denies on its own did not fit
	quotas         []quotaTally // the request's quotas: nil, nothing allocated, without quota hits
}

// quotaTally is one quota of a request: its group, and whether one of its
// hits did not fit.
type quotaTally struct {
	group uint32
	over  bool
}

// add counts h, which fits or not.
func (r *requestRule) add(h *Hit, fits bool) {
	switch {
	case h.givesBack() || h.Shadow:
	case h.Quota:
		for i := range r.quotas {
			if r.quotas[i].group == h.QuotaGroup {
				r.quotas[i].over = r.quotas[i].over || !fits
				return
			}
		}
		r.quotas = append(r.quotas, quotaTally{group: h.QuotaGroup, over: !fits})
	case !fits:
		r.enforcedDenied = true
	}
}

// denied reports whether the hits counted deny their request.
func (r *requestRule) denied() bool {
	if r.enforcedDenied {
		return true
	}
	for _, q := range r.quotas {
		if !q.over {
			return false
		}
	}
	return len(r.quotas) > 0
}

// quotaOver reports whether the quota of group is over: one of its hits
// counted did not fit.
func (r *requestRule) quotaOver(group uint32) bool {
	for _, q := range r.quotas {
		if q.group == group {
			return q.over
		}
	}
	return false
}

// ruleOf tallies hits by their verdicts, one per hit.
func ruleOf(hits []Hit, verdicts []Verdict) requestRule {
	var r requestRule
	for i := range hits {
		r.add(&hits[i], verdicts[i].Admitted)
	}
	return r
}

// takenBack reports, of a request decided in parts (across Redis Cluster
// slots, or Split's two stores, each deciding its quota hits as shadow
// ones), which charges go back once all its verdicts are in: every charge
// (owesBack) when the request is denied, a quota hit's also when its quota
// turns out over. It returns nil when nothing goes back.
func takenBack(hits []Hit, verdicts []Verdict) []bool {
	r := ruleOf(hits, verdicts)
	denied := r.denied()
	var back []bool
	for i := range hits {
		h := &hits[i]
		if owesBack(h, &verdicts[i]) && (denied || h.quota() && r.quotaOver(h.QuotaGroup)) {
			if back == nil {
				back = make([]bool, len(hits))
			}
			back[i] = true
		}
	}
	return back
}
