package service

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Validation of a request before anything is counted.

// invalidRequest is a refused request: reason labels the metric, msg tells
// the caller what to fix.
type invalidRequest struct {
	reason string
	msg    string
}

func (e *invalidRequest) Error() string { return e.msg }

func invalid(reason, format string, args ...any) *invalidRequest {
	return &invalidRequest{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// validate checks req against the bounds the operator controls (the
// descriptors and entries of Envoy's rate limit actions) and the fields
// Envoy always sets; its errors are *invalidRequest. What a client controls,
// the values, never fails a request: any length (within the message bound)
// and any bytes are limited like others.
func (s *Service) validate(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.Domain == "":
		return invalid("empty_domain", "domain is empty")
	case len(req.Descriptors) == 0:
		return invalid("no_descriptors", "request has no descriptors")
	case len(req.Descriptors) > s.opts.MaxDescriptors:
		// The codec stops decoding at one past the bound: the count is not
		// known.
		return invalid("too_many_descriptors", "request has more than the limit of %d descriptors", s.opts.MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		switch {
		case len(d.Entries) > s.opts.MaxEntries:
			return invalid("too_many_entries", "descriptor %d has more than the limit of %d entries", i, s.opts.MaxEntries)
		}
		for j, e := range d.Entries {
			if e.Key == "" {
				return invalid("empty_key", "descriptor %d entry %d has an empty key", i, j)
			}
		}
	}
	return nil
}
