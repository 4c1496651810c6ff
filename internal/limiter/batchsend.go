package limiter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/slidingwindow/ratelimit/scripts/lua"
)

// Sending a batch: its calls become commands (one decide call per hash
// slot, the other scripts on their own), pipelined per server in one write
// and one read, re-sent where Redis refused them without running them
// (NOSCRIPT, a function library not loaded, MOVED, ASK, TRYAGAIN), and
// answered to their callers; gathering a batch is batcher.go's.

// deadline is the latest of the batch's callers' deadlines, at most the
// store timeout from now: past it every caller has been answered. A batch
// holding a call with a late form has the whole store timeout; its other
// calls are left out once their own deadlines pass (send.build), though a
// connection dialled inside the pipeline can write one a little late.
func (b *batcher) deadline(batch []*call) time.Time {
	limit := time.Now().Add(b.timeout)
	var latest time.Time
	for _, c := range batch {
		if c.lateArgs != nil {
			return limit
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	if latest.After(limit) {
		return limit
	}
	return latest
}

// send is one command of a batch: a decide call for the requests of one
// slot, or another script call.
type send struct {
	calls  []*call
	script *redis.Script // nil: decide
	slot   int           // a decide's
	keys   []string
	args   []any
	form   form
	target redis.UniversalClient
	asking bool // an ASK redirection: ASKING goes first
	// resends counts the re-sends for other reasons than TRYAGAIN.
	resends int
	// cmd is the command as last sent: a *redis.Cmd for a script call, a
	// *redis.IntSliceCmd for a decide call.
	cmd redis.Cmder
}

// form is how a command reaches Redis.
type form uint8

const (
	formFunction form = iota // FCALL of the library's function
	formSHA                  // EVALSHA
	formEval                 // EVAL, which also caches the script
)

// exec sends a batch and gives every call its outcome.
func (b *batcher) exec(batch []*call) {
	ctx, cancel := context.WithDeadline(context.Background(), b.deadline(batch))
	defer cancel()
	ctx, span := b.startSpan(ctx, batch)
	sends := b.perform(ctx, b.sends(batch))
	b.endSpan(span, batch, sends)
	for _, s := range sends {
		if s.script != nil {
			s.calls[0].done <- outcome{cmd: s.cmd.(*redis.Cmd)}
			continue
		}
		vals, err := s.cmd.(*redis.IntSliceCmd).Result()
		if hits := s.hits(); err == nil && len(vals) != 4*hits {
			err = fmt.Errorf("%w: %d values for %d hits", errBadReply, len(vals), hits)
		}
		for _, c := range s.calls {
			n := 4 * len(c.keys)
			switch {
			case err != nil:
				c.done <- outcome{err: err}
			case c.sentLate: // a caller still waiting answers by its failure mode
				c.done <- outcome{err: fmt.Errorf("%w: %w", ErrOverloaded, context.DeadlineExceeded)}
				vals = vals[n:]
			default:
				c.done <- outcome{vals: vals[:n:n]}
				vals = vals[n:]
			}
		}
	}
}

// batchSpanName names the span of a batch's Redis calls.
const batchSpanName = "ratelimit.redis.batch"

// startSpan starts the span of batch, linked to the span of each request it
// carries. With tracing off it costs a context lookup per call.
func (b *batcher) startSpan(ctx context.Context, batch []*call) (context.Context, trace.Span) {
	var links []trace.Link
	for _, c := range batch {
		if sc := trace.SpanContextFromContext(c.ctx); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	if links == nil {
		return b.tracer.Start(ctx, batchSpanName, trace.WithSpanKind(trace.SpanKindClient))
	}
	return b.tracer.Start(ctx, batchSpanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...))
}

// endSpan describes the batch on its span, records the commands' errors,
// and ends it.
func (b *batcher) endSpan(span trace.Span, batch []*call, sends []*send) {
	defer span.End()
	if !span.IsRecording() {
		return
	}
	hits := 0
	for _, c := range batch {
		hits += len(c.keys)
	}
	var slots []int
	var commands []string
	failed := 0
	for _, s := range sends {
		if s.script == nil && !slices.Contains(slots, s.slot) {
			slots = append(slots, s.slot)
		}
		if name := s.commandName(); !slices.Contains(commands, name) {
			commands = append(commands, name)
		}
		if err := s.cmd.Err(); err != nil {
			failed++
			span.RecordError(err)
			if failed == 1 {
				span.SetStatus(codes.Error, err.Error())
			}
		}
	}
	span.SetAttributes(
		attribute.String("db.system.name", "redis"),
		attribute.String("db.operation.name", strings.Join(commands, " ")),
		attribute.Int("ratelimit.batch.requests", len(batch)),
		attribute.Int("ratelimit.batch.hits", hits),
		attribute.IntSlice("ratelimit.redis.slots", slots),
		attribute.Int("ratelimit.redis.failed_commands", failed),
	)
	if o, ok := b.server.(interface{ Options() *redis.Options }); ok {
		span.SetAttributes(attribute.String("server.address", o.Options().Addr))
	}
}

// hits is the number of hits of decide send s: its keys less the records.
func (s *send) hits() int {
	n := 0
	for _, c := range s.calls {
		n += len(c.keys)
	}
	return n
}

// commandName is the Redis command s went as last: FCALL, EVALSHA or EVAL.
func (s *send) commandName() string {
	switch s.form {
	case formEval:
		return "EVAL"
	case formSHA:
		return "EVALSHA"
	}
	return "FCALL"
}

// sends turns a batch into commands: one decide per slot, holding the
// slot's requests in queue order, and one per other script call.
func (b *batcher) sends(batch []*call) []*send {
	decideForm := formFunction
	if b.scriptsOnly.Load() {
		decideForm = formSHA
	}
	var sends []*send
	// last is the decide of the slot seen last; slots, made when a second
	// slot shows up (never outside a cluster), holds every slot's.
	var last *send
	var slots map[int]*send
	for _, c := range batch {
		if c.script != nil {
			f := formSHA
			if c.function != "" {
				f = decideForm
			}
			sends = append(sends, &send{calls: []*call{c}, script: c.script, keys: c.keys, args: c.args, form: f, target: b.server})
			continue
		}
		s := last
		if s == nil || s.slot != c.slot {
			if last != nil && slots == nil {
				slots = map[int]*send{last.slot: last}
			}
			s = slots[c.slot]
			if s == nil {
				s = &send{slot: c.slot, form: decideForm, target: b.server}
				if slots != nil {
					slots[c.slot] = s
				}
				sends = append(sends, s)
			}
			last = s
		}
		s.calls = append(s.calls, c)
	}
	return sends
}

// build makes a decide send's keys and args from its calls as they stand
// at now, before each time it goes: a call whose caller left or whose
// deadline passed is answered and left out (but one with a late form,
// which goes in it). It reports whether any call is left. A script send is
// built already.
func (s *send) build(now time.Time) bool {
	if s.script != nil {
		return true
	}
	calls := s.calls[:0]
	s.keys, s.args = s.keys[:0], s.args[:0]
	for _, c := range s.calls {
		late := c.ctx.Err() != nil || !now.Before(c.deadline)
		if late && c.lateArgs == nil {
			c.done <- outcome{err: fmt.Errorf("%w: %w", ErrOverloaded, context.DeadlineExceeded)}
			continue
		}
		if late && !c.sentLate {
			c.args, c.sentLate = c.lateArgs, true
		}
		calls = append(calls, c)
		s.keys = append(s.keys, c.keys...)
		s.args = append(s.args, c.args...)
	}
	for _, c := range calls {
		s.keys = append(s.keys, c.records...) // after every hit's key
	}
	clear(s.calls[len(calls):])
	s.calls = calls
	return len(calls) > 0
}

// maxResends bounds the times one command is re-sent for NOSCRIPT, a
// missing function library, MOVED or ASK. TRYAGAIN is bounded by the
// deadline only: it lasts as long as the migration of a slot's keys.
const maxResends = 4

// maxTryAgainWait caps the pause before a re-send after TRYAGAIN; the pause
// starts at 1 ms and doubles.
const maxTryAgainWait = 16 * time.Millisecond

// perform sends ss in one pipeline per target, and re-sends those Redis
// refused without running them, in the form or to the node it asks for. It
// returns the commands as last sent (a decide call refused with TRYAGAIN
// is split into one per request).
func (b *batcher) perform(ctx context.Context, ss []*send) []*send {
	var last []*send
	wait := time.Millisecond
	for len(ss) > 0 {
		now := time.Now()
		ss = slices.DeleteFunc(ss, func(s *send) bool { return !s.build(now) })
		if len(ss) == 0 {
			break
		}
		for _, group := range byTarget(ss) {
			b.pipeline(ctx, group[0].target, group)
		}
		var again []*send
		tryAgain := false
		for _, s := range ss {
			switch b.retry(ctx, s) {
			case resend:
				again = append(again, s)
			case resendLater:
				tryAgain = true
				again = append(again, s.split(ctx)...)
			default:
				last = append(last, s)
			}
		}
		if tryAgain {
			// A slot in migration holds some of a call's keys and not
			// the others: wait a moment for the migration to move them.
			select {
			case <-time.After(wait):
				wait = min(2*wait, maxTryAgainWait)
			case <-ctx.Done():
				for _, s := range again {
					s.cmd.SetErr(fmt.Errorf("%w: %w", s.cmd.Err(), ctx.Err()))
				}
				return append(last, again...)
			}
		}
		ss = again
	}
	return last
}

// byTarget groups ss by target, keeping their order. Outside a cluster,
// and on a cluster but for redirections, there is one target.
func byTarget(ss []*send) [][]*send {
	for _, s := range ss {
		if s.target != ss[0].target {
			groups := map[redis.UniversalClient][]*send{}
			for _, s := range ss {
				groups[s.target] = append(groups[s.target], s)
			}
			return slices.Collect(maps.Values(groups))
		}
	}
	return [][]*send{ss}
}

// split turns a decide call of several requests refused with TRYAGAIN
// into one call per request, so that a request whose keys are all on one
// node of a slot in migration runs there, whatever the others' keys. They
// keep their queue order in one pipeline, so one key's calls run in order.
func (s *send) split(ctx context.Context) []*send {
	if s.script != nil || len(s.calls) == 1 {
		return []*send{s}
	}
	parts := make([]*send, len(s.calls))
	for i, c := range s.calls {
		cmd := redis.NewIntSliceCmd(ctx)
		cmd.SetErr(s.cmd.Err())
		parts[i] = &send{calls: []*call{c}, form: s.form, target: s.target, asking: s.asking, resends: s.resends, cmd: cmd} // built before it goes
	}
	return parts
}

// pipeline sends group to target in one pipeline.
func (b *batcher) pipeline(ctx context.Context, target redis.UniversalClient, group []*send) {
	pipe := target.Pipeline()
	cmds := make([]redis.Cmder, 0, len(group))
	for _, s := range group {
		if s.asking {
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking")) // queues: the result is the command's, after Exec
		}
		switch {
		case s.script == nil:
			s.cmd = decideCmd(ctx, s.form, s.keys, s.args)
			_ = pipe.Process(ctx, s.cmd) // queues: the result is the command's, after Exec
		case s.form == formEval:
			s.cmd = s.script.Eval(ctx, pipe, s.keys, s.args...)
		case s.form == formFunction:
			s.cmd = pipe.FCall(ctx, s.calls[0].function, s.keys, s.args...)
		default:
			s.cmd = s.script.EvalSha(ctx, pipe, s.keys, s.args...)
		}
		cmds = append(cmds, s.cmd)
	}
	_, err := pipe.Exec(ctx)
	failCommandsNotRun(cmds, err)
}

// decideCmd is the decide call in form f, as go-redis's FCall, EvalSha and
// Eval build it, but reading the reply straight into integers.
func decideCmd(ctx context.Context, f form, keys []string, args []any) *redis.IntSliceCmd {
	name, code := "fcall", lua.DecideFunction()
	switch f {
	case formSHA:
		name, code = "evalsha", decideScript.Hash()
	case formEval:
		name, code = "eval", lua.Decide()
	}
	cmdArgs := make([]any, 3, 3+len(keys)+len(args))
	cmdArgs[0], cmdArgs[1], cmdArgs[2] = name, code, len(keys)
	for _, key := range keys {
		cmdArgs = append(cmdArgs, key)
	}
	cmd := redis.NewIntSliceCmd(ctx, append(cmdArgs, args...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// resending is what retry says of a command.
type resending uint8

const (
	settled     resending = iota // ran, or failed for good
	resend                       // re-send now (s prepared for it)
	resendLater                  // TRYAGAIN: re-send after a pause
)

// retry reports whether Redis refused s without running it in a way that a
// re-send mends, and prepares that re-send.
func (b *batcher) retry(ctx context.Context, s *send) resending {
	err := s.cmd.Err()
	if err == nil || ctx.Err() != nil {
		return settled
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "TRYAGAIN") {
		return resendLater
	}
	if s.resends == maxResends {
		return settled
	}
	s.resends++
	switch {
	case strings.HasPrefix(msg, "NOSCRIPT"):
		s.form = formEval
	case s.form == formFunction && strings.Contains(msg, "Function not found") && s.resends > 1:
		// The library went again between its load and the re-send (a
		// flush, a failover): the script's text cannot go missing.
		s.form = formEval
	case s.form == formFunction && strings.Contains(msg, "Function not found"):
		if err := loadLibrary(ctx, s.target); functionsRefused(err) {
			b.scriptsOnly.Store(true)
			s.form = formEval
		} else if err != nil {
			s.cmd.SetErr(err)
			return settled
		}
	case s.form == formFunction && functionsRefused(err):
		b.scriptsOnly.Store(true)
		s.form = formEval
	case strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK "):
		// "MOVED <slot> <addr>": the slot lives elsewhere now; "ASK
		// <slot> <addr>": it is being moved there, and the keys this call
		// needs are already there or not yet anywhere.
		fields := strings.Fields(msg)
		if len(fields) != 3 {
			return settled
		}
		node, err := b.node(ctx, fields[2], fields[0] == "MOVED")
		if err != nil {
			s.cmd.SetErr(fmt.Errorf("%s: %w", msg, err))
			return settled
		}
		s.target, s.asking = node, fields[0] == "ASK"
	default:
		return settled
	}
	return resend
}

// functionsRefused reports an error saying that the server runs no Redis
// Functions for this client (before Redis 7, the embedded store, or an ACL
// that does not let it): scripts then do the work.
func functionsRefused(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(strings.ToLower(msg), "unknown command") || strings.Contains(msg, "NOPERM")
}

// loadLibrary loads the decide function library on server; one another
// instance loaded is this one (its name carries the code's hash).
func loadLibrary(ctx context.Context, server redis.UniversalClient) error {
	err := server.FunctionLoad(ctx, lua.Library()).Err()
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		return fmt.Errorf("FUNCTION LOAD: %w", err)
	}
	return nil
}

// prepare makes server ready for the batcher's calls: the decide code
// loaded (a function library, or the script where Redis Functions are not
// available) and a connection open per worker.
func (b *batcher) prepare(ctx context.Context) error {
	err := loadLibrary(ctx, b.server)
	if functionsRefused(err) {
		b.scriptsOnly.Store(true)
		err = decideScript.Load(ctx, b.server).Err()
	}
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, batchWorkers)
	for i := range batchWorkers {
		wg.Go(func() { errs[i] = b.server.Ping(ctx).Err() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// failCommandsNotRun gives the pipeline's error to the commands it left
// without an answer: go-redis reports a failure before sending (a refused
// connection, a wrong password) only from Exec.
func failCommandsNotRun(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, cmd := range cmds {
		if cmd.Err() == nil && !answered(cmd) {
			cmd.SetErr(err)
		}
	}
}

// answered reports whether cmd, one of the batcher's, holds a reply.
func answered(cmd redis.Cmder) bool {
	switch cmd := cmd.(type) {
	case *redis.Cmd:
		return cmd.Val() != nil
	case *redis.IntSliceCmd:
		return cmd.Val() != nil
	}
	return true
}

func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
