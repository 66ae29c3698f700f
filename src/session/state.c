/* state.c - the states of a session and the only transitions between them, as one table
 * that session.c consults under its lock and tests/unit/test-session.c checks whole. */
#include <errno.h>

#include "session/session-int.h"

/* What each event does in each state: the new state, or the error that refuses it. */
static const int transitions[SESSION_N_STATES][SESSION_N_EVENTS] = {
    [SESSION_IDLE] =
        {
            [SESSION_EV_BEGIN] = SESSION_RUNNING,
            [SESSION_EV_END] = -EINVAL,            /* nothing was begun */
            [SESSION_EV_INTERRUPT] = SESSION_IDLE, /* no cell to interrupt */
            [SESSION_EV_INTERRUPT_NEXT] = SESSION_ARMED,
            [SESSION_EV_CLOSE] = SESSION_CLOSED,
        },
    [SESSION_ARMED] =
        {
            /* The interrupt is sent as soon as the cell's request is out. */
            [SESSION_EV_BEGIN] = SESSION_INTERRUPTING,
            [SESSION_EV_END] = -EINVAL,
            [SESSION_EV_INTERRUPT] = SESSION_ARMED,
            [SESSION_EV_INTERRUPT_NEXT] = SESSION_ARMED,
            [SESSION_EV_CLOSE] = SESSION_CLOSED,
        },
    [SESSION_RUNNING] =
        {
            [SESSION_EV_BEGIN] = -EBUSY, /* one execution at a time */
            [SESSION_EV_END] = SESSION_IDLE,
            [SESSION_EV_INTERRUPT] = SESSION_INTERRUPTING,
            [SESSION_EV_INTERRUPT_NEXT] = SESSION_INTERRUPTING,
            [SESSION_EV_CLOSE] = SESSION_CLOSED,
        },
    [SESSION_INTERRUPTING] =
        {
            [SESSION_EV_BEGIN] = -EBUSY,
            [SESSION_EV_END] = SESSION_IDLE, /* an interrupt is owed to one cell only */
            [SESSION_EV_INTERRUPT] = SESSION_INTERRUPTING,
            [SESSION_EV_INTERRUPT_NEXT] = SESSION_INTERRUPTING,
            [SESSION_EV_CLOSE] = SESSION_CLOSED,
        },
    [SESSION_CLOSED] =
        {
            /* Final: whoever waited to begin hears that the session is gone. */
            [SESSION_EV_BEGIN] = -ESHUTDOWN,
            [SESSION_EV_END] = SESSION_CLOSED,
            [SESSION_EV_INTERRUPT] = SESSION_CLOSED,
            [SESSION_EV_INTERRUPT_NEXT] = SESSION_CLOSED,
            [SESSION_EV_CLOSE] = SESSION_CLOSED,
        },
};

int session_state_next(enum session_state st, enum session_event ev)
{
    if ((unsigned)st >= SESSION_N_STATES || (unsigned)ev >= SESSION_N_EVENTS)
        return -EINVAL;
    return transitions[st][ev];
}

bool session_state_busy(enum session_state st)
{
    return st == SESSION_RUNNING || st == SESSION_INTERRUPTING;
}

const char *session_state_name(enum session_state st)
{
    static const char *const names[SESSION_N_STATES] = {
        [SESSION_IDLE] = "idle",       [SESSION_ARMED] = "armed",
        [SESSION_RUNNING] = "running", [SESSION_INTERRUPTING] = "interrupting",
        [SESSION_CLOSED] = "closed",
    };
    return (unsigned)st < SESSION_N_STATES ? names[st] : "invalid";
}
