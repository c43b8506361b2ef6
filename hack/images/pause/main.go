// Command pause is the sandbox ("pause") image's process of the one-node test cluster
// (hack/cluster): it holds a pod's namespaces and does nothing until it is told to stop. As the
// pause of Kubernetes does, it exits on SIGINT or SIGTERM, and reaps the orphans reparented to
// it where a pod shares its process namespace (it is then the pod's PID 1).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
