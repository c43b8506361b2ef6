package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
)

func status(ctx context.Context, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var c common
	c.register(fs)
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 1 {
		return usageError{"status takes at most one POLICY"}
	}
	cl, ns, err := c.client()
	if err != nil {
		return err
	}
	var out bytes.Buffer
	defer func() { _, _ = w.Write(out.Bytes()) }()
	var policies []v1alpha1.RateLimitPolicy
	if fs.NArg() == 1 {
		var p v1alpha1.RateLimitPolicy
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: fs.Arg(0)}, &p); err != nil {
			return fmt.Errorf("reading RateLimitPolicy %s/%s: %w", ns, fs.Arg(0), err)
		}
		policies = append(policies, p)
	} else {
		var list v1alpha1.RateLimitPolicyList
		if err := cl.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("listing the RateLimitPolicies of %s: %w", ns, err)
		}
		if len(list.Items) == 0 {
			_, err := fmt.Fprintf(&out, "namespace %s has no RateLimitPolicy\n", ns)
			return err
		}
		policies = list.Items
	}
	for i := range policies {
		if i > 0 {
			out.WriteByte('\n')
		}
		if err := printPolicy(&out, &policies[i]); err != nil {
			return err
		}
	}
	return nil
}

func printPolicy(out *bytes.Buffer, p *v1alpha1.RateLimitPolicy) error {
	fmt.Fprintf(out, "RateLimitPolicy %s/%s (generation %d, configuration %.12s)\n", p.Namespace, p.Name, p.Generation, p.Status.ConfigHash)
	var tw bytes.Buffer
	fmt.Fprintln(&tw, "  CONDITION\tSTATUS\tREASON\tMESSAGE")
	for _, c := range p.Status.Conditions {
		stale := ""
		if c.ObservedGeneration != 0 && c.ObservedGeneration != p.Generation {
			stale = fmt.Sprintf(" (of generation %d)", c.ObservedGeneration)
		}
		fmt.Fprintf(&tw, "  %s\t%s\t%s\t%s%s\n", c.Type, c.Status, c.Reason, c.Message, stale)
	}
	if err := table(out, tw.Bytes()); err != nil {
		return err
	}
	if len(p.Status.Rules) == 0 {
		_, err := fmt.Fprintln(out, "  no sidecar has reported decisions yet")
		return err
	}
	if p.Status.Refused != "" {
		fmt.Fprintf(out, "  refused over the last interval: %s of the policy's decisions\n", p.Status.Refused)
	}
	for _, r := range p.Status.Rules {
		fmt.Fprintf(out, "  rule %s: %d decisions, %d refused, over %s across %d replicas\n", r.Name, r.Decisions, r.Refused, r.Interval.Duration, r.Replicas)
		printTop(out, "refused most", r.TopRefused)
		if c := r.Candidate; c != nil {
			fmt.Fprintf(out, "    candidate %s: would refuse %d (%s) of the interval; %d of %d since %s\n",
				c.Limit, c.WouldRefuse, c.WouldRefuseRatio, c.WouldRefuseTotal, c.DecisionsTotal, c.Since.UTC().Format("2006-01-02 15:04:05Z"))
			printTop(out, "would refuse most", c.TopRefused)
		}
	}
	return nil
}

func printTop(out *bytes.Buffer, what string, keys []v1alpha1.TopKey) {
	for _, k := range keys {
		value := ""
		if k.Value != "" {
			value = fmt.Sprintf(" %q", k.Value) // what a client sent: quoted, never raw
		}
		fmt.Fprintf(out, "    %s: %s%s ~%d (+-%d)\n", what, k.Key, value, k.Count, k.Error)
	}
}
