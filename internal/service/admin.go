package service

import (
	"context"
	"errors"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	adminv1 "github.com/slidingwindow/ratelimit/proto/ratelimit/admin/v1"
)

// AdminStore is what the admin service needs of the limiter. The service
// (internal/app) gives it the hot keys' *hotkeys.Slices the Service decides
// through (over the *limiter.Split of both stores), so that a counter is
// inspected and reset on the store its hits go to, its live slices with it.
type AdminStore interface {
	Decide(ctx context.Context, req decision.Request) ([]limiter.Verdict, error)
	Reset(ctx context.Context, h limiter.Hit) (int64, error)
}

// Admin implements adminv1.AdminServer, ratelimit.admin.v1.Admin: it
// inspects and resets the counter of one descriptor, matched and keyed
// exactly as the Service it is made with does, against that Service's
// current config. Serve it on its own listener: Reset lifts limits.
type Admin struct {
	adminv1.UnimplementedAdminServer

	svc   *Service
	store AdminStore
}

// NewAdmin returns the admin service of s, on the store s decides with.
func NewAdmin(s *Service, store AdminStore) *Admin {
	return &Admin{svc: s, store: store}
}

// RegisterAdmin registers a on a gRPC server.
func RegisterAdmin(srv grpc.ServiceRegistrar, a *Admin) {
	adminv1.RegisterAdminServer(srv, a)
}

// config is the config in force, the one ShouldRateLimit answers from.
func (a *Admin) config() *config.Config { return a.svc.current.Load().config }

// target is the limit and the counter of one descriptor; l is nil when no
// rule matches.
type target struct {
	l     *limit
	hit   limiter.Hit
	route decision.Route
}

// find validates a descriptor as ShouldRateLimit would and resolves it
// against the current config.
func (a *Admin) find(domain string, entries []*adminv1.Entry) (target, error) {
	if len(entries) == 0 {
		return target{}, status.Error(codes.InvalidArgument, "no entries")
	}
	d := &rlcommon.RateLimitDescriptor{Entries: make([]*rlcommon.RateLimitDescriptor_Entry, len(entries))}
	for i, e := range entries {
		d.Entries[i] = &rlcommon.RateLimitDescriptor_Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{d}}
	if err := a.svc.validate(req); err != nil {
		return target{}, status.Error(codes.InvalidArgument, err.Error())
	}
	l, err := resolve(a.config(), domain, d)
	if err != nil {
		return target{}, status.Error(codes.InvalidArgument, err.Error())
	}
	if l == nil || l.unlimited {
		return target{l: l}, nil
	}
	kb := limiter.KeyBuilder{Prefix: a.svc.opts.KeyPrefix, Now: a.svc.opts.Now()}
	// The counter inspected is the descriptor's first limit's, with the
	// global modes as a request's hit gets them.
	first := *l
	first.also, first.hit = nil, 0
	hits := []limiter.Hit{first.storeHit(&kb, domain, d.Entries, 0)}
	a.svc.applyModes([]*limit{&first}, hits)
	return target{l: l, hit: hits[0], route: first.route()}, nil
}

// request is a request of the target's hit alone.
func (t target) request() decision.Request {
	return decision.Request{Hits: []limiter.Hit{t.hit}, Routes: []decision.Route{t.route}}
}

// Inspect answers which rule applies to a descriptor and what its counter
// holds. It decides a hit of cost 0, which reads the counter without writing.
func (a *Admin) Inspect(ctx context.Context, req *adminv1.InspectRequest) (*adminv1.InspectResponse, error) {
	t, err := a.find(req.GetDomain(), req.GetEntries())
	if err != nil {
		return nil, err
	}
	l := t.l
	if l == nil {
		return &adminv1.InspectResponse{}, nil
	}
	resp := &adminv1.InspectResponse{
		Matched:    true,
		Rule:       ruleOf(l),
		ShadowMode: l.shadow || a.svc.opts.ShadowMode, // the rule's, or the global one
	}
	if l.unlimited {
		resp.Unlimited = true
		return resp, nil
	}
	resp.Algorithm = l.algorithm.String()
	resp.RequestsPerUnit = l.requestsPerUnit
	resp.Unit = l.unit.String()
	resp.UnitMultiplier = l.multiplier
	resp.Window = durationpb.New(l.window())
	resp.FailureMode = l.failureMode.String()
	resp.Key = t.hit.Key

	verdicts, err := a.store.Decide(ctx, t.request())
	if err != nil {
		return nil, storeError(ctx, err)
	}
	v := verdicts[0]
	remaining := uint32(min(v.Remaining, uint64(l.requestsPerUnit)))
	resp.Used = l.requestsPerUnit - remaining
	resp.Remaining = remaining
	resp.ResetAfter = durationpb.New(v.ResetAfter)
	return resp, nil
}

// Reset deletes a descriptor's counter.
func (a *Admin) Reset(ctx context.Context, req *adminv1.ResetRequest) (*adminv1.ResetResponse, error) {
	t, err := a.find(req.GetDomain(), req.GetEntries())
	if err != nil {
		return nil, err
	}
	switch {
	case t.l == nil:
		return nil, status.Errorf(codes.NotFound, "no rule of domain %q matches the descriptor: it has no counter", req.GetDomain())
	case t.l.unlimited:
		return nil, status.Errorf(codes.NotFound, "rule %q is unlimited: it has no counter", t.l.String())
	}
	deleted, err := a.store.Reset(ctx, t.hit)
	if err != nil {
		return nil, storeError(ctx, err)
	}
	a.svc.log.Info("admin: counter reset", zap.String("domain", req.GetDomain()), zap.Stringer("rule", t.l),
		zap.String("key", t.hit.Key), zap.Int64("deleted", deleted))
	return &adminv1.ResetResponse{Key: t.hit.Key, Deleted: uint32(deleted)}, nil
}

func ruleOf(l *limit) *adminv1.Rule {
	if l.rule == nil {
		return nil
	}
	return &adminv1.Rule{Id: l.rule.String(), Name: l.rule.Name, Source: l.rule.Source}
}

// storeError turns a store failure into a status: the caller's own
// cancellation or deadline as such, anything else as UNAVAILABLE.
func storeError(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	if errors.Is(err, limiter.ErrStore) {
		return status.Error(codes.Unavailable, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}
