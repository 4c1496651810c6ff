package limiter

// What denies a request, decided in one place. Go applies the rule here;
// scripts/lua/decide.lua applies its twin (its check loop, "the request's
// rule") atomically on Redis, where a request's charges depend on it and no
// round trip can be spent. The two are twins: a change to one is a change to
// the other, and TestRequestRuleTwins checks them against each other on a
// table of hit mixes.
//
// Per hit, by its flags (see Hit):
//   - a Refund never denies: it is applied whatever the request's fate;
//   - a Shadow hit never denies (Shadow wins over Quota);
//   - a Quota hit denies only together with the request's other quota hits:
//     a request that has quota hits needs at least one of them to fit;
//   - any other hit, a Record hit included, denies its request when it does
//     not fit.
//
// A request that the rule denies is charged nothing, but for its Record hits
// (a cost already spent) and its refunds. The service's global modes
// (SHADOW_MODE, QUOTA_MODE) reach the rule only as these per-hit flags.

// requestRule tallies a request's hits under the rule; the zero value is a
// request with no hits, which is not denied.
type requestRule struct {
	enforcedDenied bool // a hit that denies on its own did not fit
	quotas         bool // the request has quota hits
	quotaFits      bool // one of them fits
}

// add counts h, which fits or not.
func (r *requestRule) add(h *Hit, fits bool) {
	switch {
	case h.givesBack() || h.Shadow:
	case h.Quota:
		r.quotas = true
		r.quotaFits = r.quotaFits || fits
	case !fits:
		r.enforcedDenied = true
	}
}

// denied reports whether the hits counted deny their request.
func (r *requestRule) denied() bool { return r.enforcedDenied || r.quotas && !r.quotaFits }

// requestDenied reports whether verdicts, one per hit, deny their request.
// Across Redis Cluster slots and across Split's two stores, each part
// decides its own hits with its quota hits as shadow ones (it does not see
// the others); this decides the whole request from all the verdicts.
func requestDenied(hits []Hit, verdicts []Verdict) bool {
	var r requestRule
	for i := range hits {
		r.add(&hits[i], verdicts[i].Admitted)
	}
	return r.denied()
}
