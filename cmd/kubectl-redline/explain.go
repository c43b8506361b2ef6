package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
	"github.com/redline-dev/redline/internal/sidecar/decide"
	"github.com/redline-dev/redline/internal/sidecar/reqpath"
	"github.com/redline-dev/redline/internal/sidecar/ruleset"
)

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// headerList is a repeatable -H 'Name: value' flag.
type headerList struct{ h http.Header }

func (l *headerList) String() string { return "" }

func (l *headerList) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("header %q is not 'Name: value'", v)
	}
	l.h.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

func explain(ctx context.Context, args []string, w io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var c common
	c.register(fs)
	pod := fs.String("pod", "", "the pod whose sidecar decides the request (its labels pick the policies)")
	podLabels := fs.String("labels", "", "the pod's labels, k=v,... (instead of --pod)")
	method := fs.String("X", "GET", "the request's method")
	remote := fs.String("remote-addr", "", "the address the request came from (remoteAddress and forwardedFor key parts)")
	hops := fs.Int("trusted-hops", 0, "the sidecar's trusted X-Forwarded-For hops (its --trusted-hops)")
	headers := headerList{h: http.Header{}}
	fs.Var(&headers, "H", "a request header, 'Name: value' (repeatable)")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() != 1 {
		return usageError{"explain takes one PATH (the request's path, as the client sent it)"}
	}
	if (*pod == "") == (*podLabels == "") {
		return usageError{"give one of --pod or --labels"}
	}
	escaped, _, _ := strings.Cut(fs.Arg(0), "?")
	_, path, err := reqpath.Normalize(escaped)
	if err != nil {
		return fmt.Errorf("the sidecar refuses this path with 400 bad_request_path before any rule: %w", err)
	}
	cl, ns, err := c.client()
	if err != nil {
		return err
	}
	lbls, err := labelsOf(ctx, cl, ns, *pod, *podLabels)
	if err != nil {
		return err
	}
	doc, err := document(ctx, cl, ns)
	if err != nil {
		return err
	}
	set, err := ruleset.NewBuilder("").Build(doc, lbls)
	if err != nil {
		return fmt.Errorf("building the rules of ConfigMap %s/%s: %w", ns, policydoc.ConfigMapName, err)
	}
	var out bytes.Buffer
	defer func() { _, _ = w.Write(out.Bytes()) }()
	req := &decide.Request{Method: strings.ToUpper(*method), Path: path, Header: headers.h, RemoteAddr: *remote}
	fmt.Fprintf(&out, "configuration %.12s of namespace %s: %d of its %d policies select the pod\n", doc.Hash, ns, len(set.Policies), len(doc.Policies))
	// An engine without a Limiter: planning and explaining decide nothing.
	engine := &decide.Engine{TrustedHops: *hops}
	if _, err := engine.Plan(set, req, 1); err != nil {
		fmt.Fprintf(&out, "refused before any rule with 400 repeated_key_header: %v\n", err)
		return nil
	}
	top := topRefused(ctx, cl, ns, set)
	var tw bytes.Buffer // the table's rows, aligned by a tabwriter at the end
	fmt.Fprintln(&tw, "POLICY\tRULE\tMATCHES\tMODE\tLIMIT\tKEY HASH\tIN TOP REFUSED")
	for _, x := range engine.Explain(set, req) {
		r := x.Rule
		mode := "Enforce"
		if r.Shadow {
			mode = "Shadow"
		}
		lim := limitText(r)
		if !x.Matches {
			fmt.Fprintf(&tw, "%s\t%s\tno\t%s\t%s\t-\t-\n", r.Policy.Name, r.Name, mode, lim)
			continue
		}
		in := "no"
		if n, ok := top[r.Policy.Name+"/"+r.Name+"/"+x.Hash]; ok {
			in = fmt.Sprintf("yes (%d refused in the last interval)", n)
		}
		fmt.Fprintf(&tw, "%s\t%s\tyes\t%s\t%s\t%s\t%s\n", r.Policy.Name, r.Name, mode, lim, x.Hash, in)
		if x.CandidateHash != "" {
			cin := "no"
			if n, ok := top[r.Policy.Name+"/"+r.Name+"~candidate/"+x.CandidateHash]; ok {
				cin = fmt.Sprintf("yes (%d would-refuse in the last interval)", n)
			}
			fmt.Fprintf(&tw, "%s\t%s (candidate)\tyes\tShadow\t%s\t%s\t%s\n", r.Policy.Name, r.Name, limitText(r.Candidate), x.CandidateHash, cin)
		}
	}
	return table(&out, tw.Bytes())
}

// table writes tab-separated rows aligned in columns.
func table(out *bytes.Buffer, rows []byte) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if _, err := tw.Write(rows); err != nil {
		return err
	}
	return tw.Flush()
}

// labelsOf is the labels of pod, or those given as k=v,...
func labelsOf(ctx context.Context, cl client.Client, ns, pod, given string) (map[string]string, error) {
	if given != "" {
		set, err := labels.ConvertSelectorToLabelsMap(given)
		if err != nil {
			return nil, usageError{fmt.Sprintf("--labels: %v", err)}
		}
		return set, nil
	}
	var p corev1.Pod
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod}, &p); err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", ns, pod, err)
	}
	return p.Labels, nil
}

// document reads the namespace's compiled configuration, checked as a sidecar checks it.
func document(ctx context.Context, cl client.Client, ns string) (*policydoc.Document, error) {
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: policydoc.ConfigMapName}, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("namespace %s has no ConfigMap %s: it has no RateLimitPolicy the manager compiled", ns, policydoc.ConfigMapName)
		}
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", ns, policydoc.ConfigMapName, err)
	}
	data := []byte(cm.Data[policydoc.DataKey])
	if gz, ok := cm.BinaryData[policydoc.GzipDataKey]; ok {
		var err error
		if data, err = policydoc.Decompress(gz); err != nil {
			return nil, err
		}
	}
	if len(data) == 0 {
		return nil, errors.New("ConfigMap " + policydoc.ConfigMapName + " holds no document")
	}
	doc, err := policydoc.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w", ns, policydoc.ConfigMapName, err)
	}
	return doc, nil
}

// topRefused is, by "policy/rule/hash" (a candidate's rule ends in ~candidate), how many times
// each key of the policies' status top refused lists was refused in the last interval. A policy
// that cannot be read lists nothing.
func topRefused(ctx context.Context, cl client.Client, ns string, set *ruleset.Set) map[string]int64 {
	out := map[string]int64{}
	for _, p := range set.Policies {
		var pol v1alpha1.RateLimitPolicy
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: p.Name}, &pol); err != nil {
			continue
		}
		for _, r := range pol.Status.Rules {
			for _, k := range r.TopRefused {
				out[p.Name+"/"+r.Name+"/"+k.Key] = k.Count
			}
			if r.Candidate != nil {
				for _, k := range r.Candidate.TopRefused {
					out[p.Name+"/"+r.Name+"~candidate/"+k.Key] = k.Count
				}
			}
		}
	}
	return out
}

// limitText is a rule's limit as the table shows it: requests per window and algorithm, per
// calendar period in its zone, or requests in progress at once and, when the rule queues, how
// many requests of a full key wait for a slot and for how long at most, and when it lets a
// request whose slot is lost finish, that choice (it may run the key over its limit).
func limitText(r *ruleset.Rule) string {
	switch c := r.Limit.Calendar; {
	case r.InFlight != nil:
		text := fmt.Sprintf("%d in flight", r.InFlight.Max)
		if r.Queue != nil {
			text += fmt.Sprintf(", queue %d for %s", r.Queue.Size, r.Queue.Timeout)
		}
		if r.LetFinish {
			text += ", onSlotLost: Finish"
		}
		return text
	case c != nil:
		spec := c.Spec()
		return fmt.Sprintf("%d/%s %s", r.Limit.Requests, spec.Unit, cmp.Or(spec.Zone, "UTC"))
	}
	return fmt.Sprintf("%d/%s %s", r.Limit.Requests, r.Limit.Window, r.Limit.Algorithm)
}
