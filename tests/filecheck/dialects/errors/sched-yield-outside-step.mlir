// RUN: not schedir opt %s 2>&1 | filecheck %s
// sched.yield outside a sched.step.

"sched.yield"() : () -> ()

// CHECK: schedir: error: {{.*}}sched-yield-outside-step.mlir:4:1: sched.yield must end a sched.step
// CHECK-NOT: Traceback
