package checkapi

import (
	"encoding/json"
	"net/http"

	"github.com/redline-dev/redline/internal/sidecar/ruleset"
	"github.com/redline-dev/redline/internal/topkeys"
)

// TopKeysPath is where one sidecar's top keys are served, on the decision API's listener
// (loopback unless the pod opts in): what its rules counted since its last heartbeat.
const TopKeysPath = "/v1/topkeys"

// TopKeysRule is what one rule (or one rule's candidate) counted since the sidecar's last
// heartbeat.
type TopKeysRule struct {
	Policy    string `json:"policy"`
	Rule      string `json:"rule"`
	Candidate bool   `json:"candidate,omitempty"`
	Decisions uint64 `json:"decisions"`
	// Refused lists who the rule refused (a candidate or a Shadow rule: would have refused).
	Refused TopKeysList `json:"refused"`
	// Admitted lists who the rule admitted most.
	Admitted TopKeysList `json:"admitted"`
}

// TopKeysList is a sketch's heaviest keys: by hash, and by value where the rule reports values.
type TopKeysList struct {
	Total uint64         `json:"total"`
	Keys  []TopKeysEntry `json:"keys,omitempty"`
}

// TopKeysEntry is one key: counted at least count-error times.
type TopKeysEntry struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error,omitempty"`
}

// TopKeysHandler serves GET /v1/topkeys.
type TopKeysHandler struct {
	Store *ruleset.Store
}

func (h *TopKeysHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, "use GET")
		return
	}
	set := h.Store.Current()
	if set == nil {
		writeError(w, http.StatusServiceUnavailable, "no policies loaded")
		return
	}
	out := []TopKeysRule{}
	add := func(rule *ruleset.Rule, candidate bool) {
		if rule.Top == nil {
			return
		}
		iv := rule.Top.Peek()
		out = append(out, TopKeysRule{Policy: rule.Policy.Name, Rule: rule.Name, Candidate: candidate, Decisions: iv.Decisions,
			Refused: list(iv.Refused, rule.ReportValues), Admitted: list(iv.Admitted, rule.ReportValues)})
	}
	for _, rule := range set.Rules {
		add(rule, false)
		if rule.Candidate != nil {
			add(rule.Candidate, true)
		}
	}
	body, err := json.Marshal(out)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header()["Content-Type"] = []string{contentTypeJSON}
	_, _ = w.Write(append(body, '\n'))
}

func list(s topkeys.Snapshot, values bool) TopKeysList {
	l := TopKeysList{Total: s.Total}
	for _, e := range s.Entries {
		k := TopKeysEntry{Key: e.Key, Count: e.Count, Error: e.Err}
		if values {
			k.Value = e.Label
		}
		l.Keys = append(l.Keys, k)
	}
	return l
}
