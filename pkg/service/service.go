// Package service serves Envoy's rate limit protocols from a config and a
// limiter: envoy.service.ratelimit.v3.RateLimitService (ShouldRateLimit, what
// Envoy's ratelimit filters call) and
// envoy.service.rate_limit_quota.v3.RateLimitQuotaService (the
// rate_limit_quota filter's quota reports), registered on the caller's own
// gRPC server beside its other services.
//
// It answers exactly as the ratelimit binary does: per descriptor a status,
// the remaining quota, the time until reset and, on a denial, a retry-after
// header. OVER_LIMIT is an answer, not an error, and a descriptor value (any
// bytes a client sends) never fails a call. A request past the bounds
// (Options: descriptors, entries, size) or with a malformed limit override is
// refused with codes.InvalidArgument; a store that cannot decide yields
// codes.Unavailable where the rule's failure mode defers to Envoy's.
package service

import (
	"context"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"

	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/pkgbridge"
	"github.com/slidingwindow/ratelimit/internal/rlqs"
	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/transport"
	"github.com/slidingwindow/ratelimit/pkg/config"
	"github.com/slidingwindow/ratelimit/pkg/limiter"
)

// Options configure a Service. A nil *Options means the defaults, which are
// the ratelimit binary's.
type Options struct {
	// KeyPrefix goes before every counter's key, to separate services that
	// share one Redis (the binary's --key-prefix).
	KeyPrefix string
	// RateLimitHeaders adds the RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset headers to every answer with a limited descriptor.
	RateLimitHeaders bool
	// ShadowMode denies no request: each descriptor's status stays what it
	// would be, only the overall code is OK (envoyproxy/ratelimit's
	// SHADOW_MODE).
	ShadowMode bool
	// QuotaMode denies a request only when every descriptor is over its
	// limit (envoyproxy/ratelimit's QUOTA_MODE).
	QuotaMode bool
	// MaxDescriptors and MaxEntries bound a request's descriptors and a
	// descriptor's entries (a request past them is answered with an
	// error status); zero means the defaults the ratelimit binary ships
	// with (its --max-descriptors and --max-entries).
	MaxDescriptors, MaxEntries int
	// MaxRequestBytes bounds a request message; zero means 256 KiB.
	MaxRequestBytes int
}

// Service answers ShouldRateLimit and quota reports. It is safe for
// concurrent use.
type Service struct {
	svc          *service.Service
	rlqs         *service.RLQS
	codec        encoding.CodecV2
	maxRecvBytes int
}

// New returns a Service answering from cfg, deciding on lim. Counters live
// where lim keeps them: services (and ratelimit binaries) on one Redis with
// one KeyPrefix count together.
func New(cfg *config.Config, lim *limiter.Limiter, opts *Options) *Service {
	if opts == nil {
		opts = &Options{}
	}
	l := pkgbridge.LimiterOf(lim)
	svc := service.New(pkgbridge.ConfigOf(cfg), decision.Direct(l), &service.Options{
		KeyPrefix:        opts.KeyPrefix,
		RateLimitHeaders: opts.RateLimitHeaders,
		ShadowMode:       opts.ShadowMode,
		QuotaMode:        opts.QuotaMode,
		MaxDescriptors:   opts.MaxDescriptors,
		MaxEntries:       opts.MaxEntries,
		MaxRequestBytes:  opts.MaxRequestBytes,
	})
	return &Service{
		svc:          svc,
		rlqs:         service.NewRLQS(svc, rlqs.New(l, nil)),
		codec:        transport.NewCodec(orDefault(opts.MaxDescriptors, service.DefaultMaxDescriptors), orDefault(opts.MaxEntries, service.DefaultMaxEntries)),
		maxRecvBytes: orDefault(opts.MaxRequestBytes, service.DefaultMaxRequestBytes),
	}
}

// ServerOptions returns the options the gRPC server that Register is given
// must be created with: the request codec, which keeps a descriptor value's
// bytes as Envoy sent them (a header that is not UTF-8 must not fail the
// call) and bounds what a request may allocate, and the message size bound.
// Both apply to the whole server: the codec decodes every message but the
// rate limit request as grpc-go's proto codec does, so services on protobuf
// are unaffected, but it replaces a codec of the server's own; the size
// bound (256 KiB unless Options say) is every service's. A server whose
// other services need more takes its own grpc.MaxRecvMsgSize after these:
// the last one given wins, and the service's bounds on descriptors still
// hold.
func (s *Service) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(s.codec),
		grpc.MaxRecvMsgSize(s.maxRecvBytes),
	}
}

// Register registers the rate limit service and the quota service on r,
// a server created with ServerOptions.
func (s *Service) Register(r grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(r, s.svc)
	rlqsv3.RegisterRateLimitQuotaServiceServer(r, s.rlqs)
}

// ShouldRateLimit decides a request in process, as a gRPC call would: a Go
// program's own requests (an HTTP middleware, say) count on the counters
// Envoy's requests count on.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.svc.ShouldRateLimit(ctx, req)
}

// Reload puts cfg in force atomically, unless it has the Hash of the config
// in force, and reports whether it did. Requests in flight finish with the
// config they started with. Counters carry over.
func (s *Service) Reload(cfg *config.Config) bool { return s.svc.Reload(pkgbridge.ConfigOf(cfg)) }

// Drain ends every quota stream, and refuses new ones, so that a server about
// to stop sends its Envoys to the other instances: call it before the
// server's GracefulStop, which would otherwise wait for the streams.
func (s *Service) Drain() { s.rlqs.Drain() }

// orDefault is n, or the service's default d where n is zero (or less).
func orDefault(n, d int) int {
	if n <= 0 {
		return d
	}
	return n
}
