package service

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// referenceMetrics counts a decided request in envoyproxy/ratelimit's
// rate_limit metrics, one series per limit named as the reference names it
// (see statKey), a request that only --shadow-mode admitted (shadowed) in
// its global_shadow_mode, and one to a domain cfg does not have in its
// domain_not_found.
func (s *Service) referenceMetrics(cfg *config.Config, req *rlsv3.RateLimitRequest, limits []*limit, hits []limiter.Hit,
	verdicts []limiter.Verdict, shadowed bool,
) {
	m := s.opts.Metrics
	if m == nil {
		return
	}
	// Only statsd has domain_not_found: without it, no name is made.
	if m.SendsStats() && !cfg.HasDomain(req.Domain) {
		m.DomainNotFound(metricValue(req.Domain), len(req.Descriptors)) // the client's: bounded as a value
	}
	for i, l := range limits {
		// Like the reference, unlimited rules and descriptors without a
		// limit have no series.
		if l == nil || l.unlimited || l.hit < 0 {
			continue
		}
		// Of several limits (rate_limits), the one the status shows: the
		// reference has one limit per descriptor.
		v := verdicts[l.hit]
		for _, a := range l.also {
			if tighter(a, verdicts[a.hit], l, v) {
				l, v = a, verdicts[a.hit]
			}
		}
		key, fallback := statKey(req.Domain, l.rule, req.Descriptors[i].Entries)
		series := m.Descriptor(key, fallback)
		h := hits[l.hit]
		if v.FailureVerdict {
			series.Total(h.Cost)
			continue
		}
		limit := uint64(l.requestsPerUnit)
		remaining := min(v.Remaining, limit)
		before := limit - remaining // what the counter holds without this hit
		if v.Admitted && v.Charged {
			before -= min(before, h.Cost)
		}
		// The rule's own shadow_mode (an override never is in shadow mode).
		series.Hits(h.Cost, limit, before, v.Admitted, l.shadow, s.opts.NearLimitRatio)
	}
	if shadowed {
		m.GlobalShadowMode()
	}
}

// statKey is the reference's name of the limit l applies to a descriptor
// (config.Rule.StatKey, its FullKey), reshaped as the reference does by the
// rule's detailed_metric (every entry's key_value) or its levels'
// value_to_metric (the request's value in place of a key-only or wildcard
// level, share_threshold keeping the pattern). fallback is the name
// without request values. A limit override without a rule is named by its
// descriptor's keys: the reference puts the values in too, which no
// config bounds.
func statKey(domain string, rule *config.Rule, entries []*rlcommon.RateLimitDescriptor_Entry) (key, fallback string) {
	if rule == nil {
		var b strings.Builder
		b.WriteString(domain)
		for _, e := range entries {
			b.WriteByte('.')
			b.WriteString(metricValue(e.Key))
		}
		return b.String(), b.String()
	}
	fallback = rule.StatKey()
	reshaped, shared := rule.DetailedMetric, false
	for _, lv := range rule.Levels {
		reshaped = reshaped || lv.ValueToMetric
		shared = shared || lv.ShareThreshold
	}
	if !reshaped || len(entries) != len(rule.Levels) {
		return fallback, fallback
	}
	var b strings.Builder
	b.WriteString(domain)
	for i, e := range entries {
		lv := rule.Levels[i]
		b.WriteByte('.')
		b.WriteString(e.Key)
		switch {
		case lv.ShareThreshold:
			b.WriteByte('_')
			b.WriteString(lv.Value)
		case rule.DetailedMetric:
			if e.Value != "" || !shared { // the reference's two paths differ here
				b.WriteByte('_')
				b.WriteString(metricValue(e.Value))
			}
		case lv.ValueToMetric && (lv.Value == "" || lv.Wildcard):
			if e.Value != "" {
				b.WriteByte('_')
				b.WriteString(metricValue(e.Value))
			}
		case lv.Value != "":
			b.WriteByte('_')
			b.WriteString(lv.Value)
		}
	}
	return b.String(), fallback
}

// metricValue is a request's value as it goes into a metric's name: as it
// is, as the reference writes it, unless it is longer than
// limiter.MaxKeyComponent or not UTF-8 (which Prometheus refuses as a label
// value): then '#' and its digest, as in the store key (see Key schema).
// Whatever a client sends, the series' names stay valid and bounded.
func metricValue(v string) string {
	if len(v) <= limiter.MaxKeyComponent && utf8.ValidString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "#" + base64.RawURLEncoding.EncodeToString(sum[:])
}
