package controller_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/fleet"
)

// policyTable asks the API server for a namespace's policies as kubectl get does: as a Table,
// whose columns are the CRD's additionalPrinterColumns.
func policyTable(ns string) *metav1.Table {
	GinkgoHelper()
	hc, err := rest.HTTPClientFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequest(http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/apis/redline.dev/v1alpha1/namespaces/"+ns+"/ratelimitpolicies", nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1")
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.StatusCode).To(Equal(http.StatusOK), string(body))
	t := &metav1.Table{}
	Expect(json.Unmarshal(body, t)).To(Succeed())
	Expect(t.Kind).To(Equal("Table"))
	return t
}

var _ = Describe("kubectl get rlp", func() {
	It("shows Enforced beside Programmed, with the condition's status", func(ctx SpecContext) {
		ns := newNamespace(ctx)
		Expect(k8s.Create(ctx, policy(ns, "p", 100))).To(Succeed())
		p := expectProgrammed(ctx, ns, "p")
		_, err := fleet.Announce(ctx, rdb, ns, "pod-a", p.Status.ConfigHash, 10*time.Second, []string{"p"})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) {
			g.Expect(condition(g, ctx, ns, "p", v1alpha1.ConditionEnforced).Status).To(Equal(metav1.ConditionTrue))
		}, timeout, interval).Should(Succeed())

		t := policyTable(ns)
		column := map[string]int{}
		for i, c := range t.ColumnDefinitions {
			column[c.Name] = i
		}
		Expect(column).To(HaveKey("Programmed"))
		Expect(column).To(HaveKey("Enforced"))
		Expect(column["Enforced"]).To(Equal(column["Programmed"]+1), "Enforced stands beside Programmed")
		Expect(t.ColumnDefinitions[column["Enforced"]].Priority).To(BeZero(), "shown without -o wide")
		Expect(t.Rows).To(HaveLen(1))
		Expect(t.Rows[0].Cells[column["Programmed"]]).To(Equal("True"))
		Expect(t.Rows[0].Cells[column["Enforced"]]).To(Equal("True"))
	})
})
