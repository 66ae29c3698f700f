/* test-session.c - unit tests for the session state machine (src/session/state.c): every
 * state against every event, and the rules the table must keep whatever is added to it.
 * Sessions that run cells in real sandboxes are tests/integration's. */
#include <errno.h>

#include "runner.h"
#include "session/session-int.h"

/* Written out by hand, not derived from the table: what each event must do. */
static const struct {
    enum session_state from;
    enum session_event ev;
    int to; /* a state, or the -errno that refuses the event */
} expected[] = {
    {SESSION_IDLE, SESSION_EV_BEGIN, SESSION_RUNNING},
    {SESSION_IDLE, SESSION_EV_END, -EINVAL},
    {SESSION_IDLE, SESSION_EV_INTERRUPT, SESSION_IDLE},
    {SESSION_IDLE, SESSION_EV_INTERRUPT_NEXT, SESSION_ARMED},
    {SESSION_IDLE, SESSION_EV_CLOSE, SESSION_CLOSED},

    {SESSION_ARMED, SESSION_EV_BEGIN, SESSION_INTERRUPTING},
    {SESSION_ARMED, SESSION_EV_END, -EINVAL},
    {SESSION_ARMED, SESSION_EV_INTERRUPT, SESSION_ARMED},
    {SESSION_ARMED, SESSION_EV_INTERRUPT_NEXT, SESSION_ARMED},
    {SESSION_ARMED, SESSION_EV_CLOSE, SESSION_CLOSED},

    {SESSION_RUNNING, SESSION_EV_BEGIN, -EBUSY},
    {SESSION_RUNNING, SESSION_EV_END, SESSION_IDLE},
    {SESSION_RUNNING, SESSION_EV_INTERRUPT, SESSION_INTERRUPTING},
    {SESSION_RUNNING, SESSION_EV_INTERRUPT_NEXT, SESSION_INTERRUPTING},
    {SESSION_RUNNING, SESSION_EV_CLOSE, SESSION_CLOSED},

    {SESSION_INTERRUPTING, SESSION_EV_BEGIN, -EBUSY},
    {SESSION_INTERRUPTING, SESSION_EV_END, SESSION_IDLE},
    {SESSION_INTERRUPTING, SESSION_EV_INTERRUPT, SESSION_INTERRUPTING},
    {SESSION_INTERRUPTING, SESSION_EV_INTERRUPT_NEXT, SESSION_INTERRUPTING},
    {SESSION_INTERRUPTING, SESSION_EV_CLOSE, SESSION_CLOSED},

    {SESSION_CLOSED, SESSION_EV_BEGIN, -ESHUTDOWN},
    {SESSION_CLOSED, SESSION_EV_END, SESSION_CLOSED},
    {SESSION_CLOSED, SESSION_EV_INTERRUPT, SESSION_CLOSED},
    {SESSION_CLOSED, SESSION_EV_INTERRUPT_NEXT, SESSION_CLOSED},
    {SESSION_CLOSED, SESSION_EV_CLOSE, SESSION_CLOSED},
};

static int next(int st, int ev)
{
    return session_state_next((enum session_state)st, (enum session_event)ev);
}

TEST(every_state_and_event_does_what_is_written)
{
    CHECK(ARRAY_SIZE(expected) == SESSION_N_STATES * SESSION_N_EVENTS);
    for (size_t i = 0; i < ARRAY_SIZE(expected); i++) {
        int got = next(expected[i].from, expected[i].ev);
        if (got != expected[i].to)
            fprintf(stderr, "from %s, event %d: %d, expected %d\n",
                    session_state_name(expected[i].from), expected[i].ev, got, expected[i].to);
        CHECK(got == expected[i].to);
    }
    /* ... and no pair is listed twice (so none is missing). */
    for (size_t i = 0; i < ARRAY_SIZE(expected); i++)
        for (size_t j = i + 1; j < ARRAY_SIZE(expected); j++)
            CHECK(expected[i].from != expected[j].from || expected[i].ev != expected[j].ev);
}

TEST(every_transition_lands_in_a_state_or_is_refused_with_a_reason)
{
    for (int st = 0; st < SESSION_N_STATES; st++)
        for (int ev = 0; ev < SESSION_N_EVENTS; ev++) {
            int to = next(st, ev);
            CHECK((to >= 0 && to < SESSION_N_STATES) || to == -EBUSY || to == -ESHUTDOWN ||
                  to == -EINVAL);
        }
}

TEST(one_execution_at_a_time)
{
    for (int st = 0; st < SESSION_N_STATES; st++) {
        int to = next(st, SESSION_EV_BEGIN);
        if (session_state_busy(st))
            CHECK(to == -EBUSY);
        else if (st != SESSION_CLOSED)
            CHECK(to >= 0 && session_state_busy(to));
    }
}

TEST(an_ended_execution_leaves_the_session_idle_with_nothing_owed)
{
    for (int st = 0; st < SESSION_N_STATES; st++) {
        int to = next(st, SESSION_EV_END);
        if (session_state_busy(st))
            CHECK(to == SESSION_IDLE);
        else if (st != SESSION_CLOSED)
            CHECK(to == -EINVAL); /* nothing was begun */
    }
}

TEST(interrupts_never_start_or_end_an_execution)
{
    int evs[] = {SESSION_EV_INTERRUPT, SESSION_EV_INTERRUPT_NEXT};
    for (int st = 0; st < SESSION_N_STATES; st++)
        for (size_t i = 0; i < ARRAY_SIZE(evs); i++) {
            int to = next(st, evs[i]);
            CHECK(to >= 0);
            CHECK(session_state_busy(to) == session_state_busy(st));
        }
}

TEST(an_interrupt_for_the_next_cell_is_kept_until_that_cell_runs)
{
    int st = next(SESSION_IDLE, SESSION_EV_INTERRUPT_NEXT);
    CHECK(st == SESSION_ARMED);
    CHECK(next(st, SESSION_EV_INTERRUPT) == SESSION_ARMED);
    st = next(st, SESSION_EV_BEGIN);
    CHECK(st == SESSION_INTERRUPTING); /* the cell is interrupted once it is sent */
    CHECK(next(st, SESSION_EV_END) == SESSION_IDLE);
    /* A plain interrupt of an idle session is not kept for a later cell. */
    CHECK(next(next(SESSION_IDLE, SESSION_EV_INTERRUPT), SESSION_EV_BEGIN) == SESSION_RUNNING);
}

TEST(closed_is_final)
{
    for (int st = 0; st < SESSION_N_STATES; st++)
        CHECK(next(st, SESSION_EV_CLOSE) == SESSION_CLOSED);
    for (int ev = 0; ev < SESSION_N_EVENTS; ev++) {
        int to = next(SESSION_CLOSED, ev);
        CHECK(to == SESSION_CLOSED || to == -ESHUTDOWN);
    }
    CHECK(!session_state_busy(SESSION_CLOSED));
}

TEST(a_cycle_through_the_states)
{
    int st = SESSION_IDLE;
    static const struct {
        int ev, to;
    } steps[] = {
        {SESSION_EV_BEGIN, SESSION_RUNNING},
        {SESSION_EV_BEGIN, -EBUSY},
        {SESSION_EV_INTERRUPT, SESSION_INTERRUPTING},
        {SESSION_EV_BEGIN, -EBUSY},
        {SESSION_EV_END, SESSION_IDLE},
        {SESSION_EV_BEGIN, SESSION_RUNNING},
        {SESSION_EV_END, SESSION_IDLE},
        {SESSION_EV_CLOSE, SESSION_CLOSED},
        {SESSION_EV_BEGIN, -ESHUTDOWN},
    };
    for (size_t i = 0; i < ARRAY_SIZE(steps); i++) {
        int to = next(st, steps[i].ev);
        CHECK(to == steps[i].to);
        if (to >= 0)
            st = to; /* a refused event leaves the state as it was */
    }
    CHECK(st == SESSION_CLOSED);
}

TEST(out_of_range_states_and_events_are_refused)
{
    CHECK(next(SESSION_N_STATES, SESSION_EV_BEGIN) == -EINVAL);
    CHECK(next(-1, SESSION_EV_BEGIN) == -EINVAL);
    CHECK(next(SESSION_IDLE, SESSION_N_EVENTS) == -EINVAL);
    CHECK(next(SESSION_IDLE, -1) == -EINVAL);
    CHECK_STREQ(session_state_name(SESSION_N_STATES), "invalid");
}

TEST(every_state_has_a_name)
{
    const char *names[] = {"idle", "armed", "running", "interrupting", "closed"};
    CHECK(ARRAY_SIZE(names) == SESSION_N_STATES);
    for (int st = 0; st < SESSION_N_STATES; st++)
        CHECK_STREQ(session_state_name(st), names[st]);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
