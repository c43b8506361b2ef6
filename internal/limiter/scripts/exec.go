package scripts

import (
	"context"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// EvalSha returns the command that runs s on keys with args, for Exec. Callers on a hot path may
// build it themselves, as long as it reads "evalsha", s.SHA, len(keys), keys..., args... with
// its first key at position 3.
func EvalSha(ctx context.Context, s Script, keys []string, args ...any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", s.SHA, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmd := redis.NewCmd(ctx, append(cmdArgs, args...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// Counts says what an Exec sent.
type Counts struct {
	// RoundTrips is the number of commands or pipelines sent, retries included.
	RoundTrips uint64
	// Loads is the number of scripts loaded after NOSCRIPT.
	Loads uint64
}

// Exec runs cmds, EVALSHAs of scripts in known (see EvalSha), in one round trip: a plain command
// when there is one, since a lone caller should not pay for pipeline bookkeeping, and a pipeline
// otherwise (go-redis sends one per node on a cluster). Every command carries its own outcome.
//
// NOSCRIPT means Redis lost its scripts (restart, failover, SCRIPT FLUSH). Exec then loads each
// script concerned with SCRIPT LOAD (every master of a cluster) and sends those commands once
// more. A command that meets NOSCRIPT even then, which only happens when scripts are flushed
// again between the load and the retry, is sent as EVAL with the script's body, which runs it and
// caches it again: a decision should not fail for want of a script Redline holds. Such a command
// is replaced in cmds by one of the same type, *redis.IntSliceCmd or *redis.Cmd.
func Exec(ctx context.Context, c redis.UniversalClient, cmds []redis.Cmder, known []Script) Counts {
	n, _ := ExecThen(ctx, c, cmds, known, nil)
	return n
}

// ExecThen is Exec with then's commands sent at the end of every round trip it makes, in the
// same pipeline: WAIT and WAITAOF answer for the writes sent before them on their connection,
// and a pipeline is one connection, so each round trip's answer for that round trip's scripts
// (a retry after NOSCRIPT included). It returns each round trip's then commands, in order;
// none when then is nil. Every round trip is a pipeline when then is set. On a cluster client
// the commands of then, which have no key, go to a node of the client's choosing: pass the
// client of the scripts' node.
func ExecThen(ctx context.Context, c redis.UniversalClient, cmds []redis.Cmder, known []Script, then func() []redis.Cmder) (Counts, [][]redis.Cmder) {
	var n Counts
	var acks [][]redis.Cmder
	send := func(ctx context.Context, c redis.UniversalClient, cmds []redis.Cmder) {
		if then == nil {
			sendCmds(ctx, c, cmds, nil)
			return
		}
		t := then()
		acks = append(acks, t)
		sendCmds(ctx, c, cmds, t)
	}
	send(ctx, c, cmds)
	n.RoundTrips++
	var retry []int // rare: only after NOSCRIPT
	for i, cmd := range cmds {
		if isNoScript(cmd.Err()) {
			retry = append(retry, i)
		}
	}
	if len(retry) == 0 {
		return n, acks
	}
	loaded := map[string]error{}
	resend := make([]redis.Cmder, 0, len(retry))
	sent := retry[:0] // the index in cmds of each of resend
	sources := make([]Script, 0, len(retry))
	for _, i := range retry {
		cmd := cmds[i]
		s, ok := scriptOf(cmd, known)
		if !ok {
			cmd.SetErr(fmt.Errorf("running script %v after NOSCRIPT: no source for it", cmd.Args()[1]))
			continue
		}
		err, done := loaded[s.SHA]
		if !done {
			if err = c.ScriptLoad(ctx, s.Source).Err(); err == nil {
				n.Loads++
			}
			loaded[s.SHA] = err
		}
		if err != nil {
			cmd.SetErr(fmt.Errorf("loading script %s after NOSCRIPT: %w", s.Name, err))
			continue
		}
		resend = append(resend, cmd)
		sent = append(sent, i)
		sources = append(sources, s)
	}
	if len(resend) == 0 {
		return n, acks
	}
	send(ctx, c, resend)
	n.RoundTrips++

	var last []redis.Cmder
	for j, cmd := range resend {
		if isNoScript(cmd.Err()) {
			e := asEval(ctx, cmd, sources[j].Source)
			cmds[sent[j]] = e
			last = append(last, e)
		}
	}
	if len(last) > 0 {
		send(ctx, c, last)
		n.RoundTrips++
	}
	return n, acks
}

// sendCmds sends cmds as one plain command or one pipeline, with then at its end; errors are
// read per command.
func sendCmds(ctx context.Context, c redis.UniversalClient, cmds, then []redis.Cmder) {
	if len(cmds) == 1 && len(then) == 0 {
		_ = c.Process(ctx, cmds[0])
		return
	}
	pipe := c.Pipeline()
	for _, cmd := range cmds {
		_ = pipe.Process(ctx, cmd)
	}
	for _, cmd := range then {
		_ = pipe.Process(ctx, cmd)
	}
	_, _ = pipe.Exec(ctx)
}

// scriptOf finds the script an EVALSHA command runs among known.
func scriptOf(cmd redis.Cmder, known []Script) (Script, bool) {
	args := cmd.Args()
	if len(args) < 2 {
		return Script{}, false
	}
	sha, _ := args[1].(string)
	for _, s := range known {
		if s.SHA == sha {
			return s, true
		}
	}
	return Script{}, false
}

// asEval returns cmd as an EVAL of source, of the same command type so that its caller reads it
// the same way.
func asEval(ctx context.Context, cmd redis.Cmder, source string) redis.Cmder {
	args := slices.Clone(cmd.Args())
	args[0], args[1] = "eval", source
	switch cmd.(type) {
	case *redis.IntSliceCmd:
		e := redis.NewIntSliceCmd(ctx, args...)
		e.SetFirstKeyPos(3)
		return e
	default:
		e := redis.NewCmd(ctx, args...)
		e.SetFirstKeyPos(3)
		return e
	}
}

// isNoScript says whether err is Redis's NOSCRIPT.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}
