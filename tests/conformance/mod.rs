//! The conformance suite: every case is written once, generic over the backend, and
//! [`conformance_suite!`] turns the list into one `#[tokio::test]` per case.

mod admin;
mod adversary;
mod any;
mod any_primitives;
mod bells;
mod bounds;
mod campaign;
mod engine;
mod fair;
mod fencing;
mod first_hour;
mod guard_surface;
mod handover;
mod history;
mod inputs;
mod interop;
mod jobs;
mod lease;
pub mod lease_env;
mod margin;
mod migrate;
mod ownership;
mod primitives;
mod queue;
mod racing;
mod rwlock;
mod schedule;
mod shares;
mod stuck_fence;
mod waiting;
mod wakeups;

use std::time::Duration;

pub use admin::*;
pub use adversary::*;
pub use any::*;
pub use any_primitives::*;
pub use bells::*;
pub use bounds::*;
pub use campaign::*;
pub use engine::*;
pub use fair::*;
pub use fencing::*;
pub use first_hour::*;
pub use guard_surface::*;
pub use handover::*;
pub use history::*;
pub use inputs::*;
pub use interop::*;
pub use jobs::*;
pub use lease::*;
pub use margin::*;
pub use migrate::*;
pub use ownership::*;
pub use primitives::*;
pub use queue::*;
pub use racing::*;
pub use rwlock::*;
pub use schedule::*;
pub use shares::*;
pub use stuck_fence::*;
pub use waiting::*;
pub use wakeups::*;

/// A lease that never runs out during a test.
const LONG: Duration = Duration::from_secs(30);
/// A lease meant to run out during a test.
const SHORT: Duration = Duration::from_millis(150);
/// Bound for anything polled: far above what a healthy run needs.
const PATIENCE: Duration = Duration::from_secs(15);

/// Expands into one multi-threaded tokio test per conformance case for backend `$db`.
macro_rules! conformance_suite {
    ($db:ty) => {
        $crate::conformance::conformance_suite!(
            @cases $db;
            one_winner_per_round,
            one_winner_takes_over_an_expired_row,
            mutual_exclusion,
            owner_checked_release_and_extend,
            expired_rows_are_taken_over_live_ones_never,
            fencing_tokens_strictly_increase,
            plain_sql_interop,
            keys_are_exact,
            bad_inputs_are_rejected_before_writing,
            acquire_waits_for_release,
            acquire_times_out,
            with_lock_returns_and_releases,
            migrate_is_rerunnable,
            a_newer_dblocks_steps_are_left_alone,
            concurrent_migrations,
            printed_sql_applied_by_another_tool,
            holder_keeps_lock_three_leases_long,
            deleted_row_fires_lost,
            stolen_row_fires_lost,
            default_owners_name_host_and_process,
            with_lock_is_cancelled_on_loss,
            short_outage_keeps_lease,
            long_outage_fires_lost,
            no_renewal_after_release,
            reaper_deletes_exactly_the_expired,
            background_reaper_reports_and_stops,
            owner_nests_and_excludes_others,
            cancelled_acquires_leave_no_orphans,
            release_after_expiry_says_so,
            missing_table_says_migrate,
            error_texts_are_actionable,
            local_waiters_are_granted_in_arrival_order,
            handed_off_waiters_wait_for_the_release,
            releases_hand_the_row_to_the_next_waiter,
            a_waiter_gone_at_the_handoff_leaves_the_key_free,
            a_handoff_of_a_taken_row_gives_nothing_away,
            handoffs_racing_another_process_never_give_two_holders,
            a_release_marked_elsewhere_wakes_both_processes_alike,
            fair_grants_follow_ticket_order,
            fair_skips_a_cancelled_waiter_at_once,
            fair_skips_a_dead_waiter_after_its_ticket_lease,
            fair_winner_cancelled_while_its_ticket_goes_leaves_no_lock,
            extended_to_a_short_lease_stays_renewed,
            many_guards_stay_held_in_few_statements,
            deleting_some_rows_fires_lost_for_exactly_those,
            leases_of_different_lengths_renew_on_their_own_schedule,
            releases_elsewhere_wake_waiters,
            killed_listener_comes_back,
            waiters_hold_no_connection,
            list_shows_every_row_in_key_order,
            list_pages_after_a_key,
            force_release_fires_lost_and_wakes_a_waiter,
            leak_check_reports_long_held_rows,
            try_with_lock_skips_a_held_key,
            job_keeps_the_key_for_its_minimum,
            job_is_bounded_by_its_maximum,
            scheduled_job_runs_once_per_tick,
            schedule_runs_each_period_exactly_once,
            schedule_counts_overruns_and_missed_periods,
            fair_cancelled_ticket_takers_leave_no_ticket,
            fair_cancellation_storm_leaves_no_rows,
            ten_thousand_guards_on_a_pool_of_two,
            table_of_another_shape_is_a_typed_error,
            reaper_purges_expired_tickets,
            semaphore_admits_exactly_its_permits,
            rw_lock_excludes_and_does_not_starve_writers,
            rw_lock_write_costs_two_commits,
            rw_lock_read_waits_for_a_write_in_flight,
            election_has_one_leader_at_a_time,
            election_run_stops_the_work_on_loss_and_campaigns_again,
            resign_hands_the_lead_to_another_process,
            a_lone_resigner_leads_again_after_its_hold_off,
            a_resigner_holds_off_no_other_local_candidate,
            multi_key_locks_are_all_or_nothing,
            cancelled_primitives_leave_no_rows,
            primitives_hear_releases_elsewhere,
            fenced_writes_tell_a_lost_lock_from_a_conflict,
            any_locker_has_one_winner_per_round,
            any_locker_with_lock_excludes,
            any_locker_tokens_increase_and_release_is_owner_checked,
            any_locker_times_out,
            any_locker_job_runs_once,
            any_locker_refuses_bad_input,
            any_semaphore_admits_exactly_its_permits,
            any_rw_lock_excludes,
            any_election_has_one_leader_and_hands_over,
            any_acquire_all_is_all_or_nothing,
            any_schedule_runs_once_per_period,
            any_guards_fence_writes_in_an_any_transaction,
            every_call_returns_within_its_bound_under_a_black_hole,
            an_abandoned_attempt_never_commits_after_its_deadline,
            pool_timeouts_say_whether_connections_answered,
            a_lease_ends_locally_before_the_database_sees_it_expire,
            an_answer_after_the_deadline_makes_no_guard,
            one_stuck_fenced_transaction_costs_one_lease,
            a_hammered_key_stays_renewed,
            every_guard_knows_locally_that_its_lease_ended,
            a_multi_guard_asserts_all_its_keys_in_its_transaction,
            a_primitive_timeout_names_its_row_and_this_process,
            a_schedule_can_skip_a_period_whose_start_it_missed,
            a_spawned_candidate_keeps_leading_through_errors_and_losses,
            a_spawned_candidate_refuses_bad_input,
            a_bell_wakes_a_waiter_of_another_process,
            hot_key_is_shared_between_processes,
            semaphore_permits_are_shared_between_processes,
            a_waiter_whose_listener_is_cut_off_still_gets_the_key,
            hot_key_grants_are_shared_across_lockers,
            semaphore_permits_are_shared_across_lockers,
            history_records_what_happened_to_each_lock,
            history_takes_one_statement_a_tick,
            history_filters_select_exactly,
            history_is_trimmed_to_its_retention,
            no_history_writes_nothing,
            shutdown_writes_the_noted_history,
            history_records_a_handoff,
            history_tells_a_takeover_from_a_fresh_acquisition,
        );
    };
    (@cases $db:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                $crate::conformance::$case::<$db>().await;
            }
        )*
    };
}

pub(crate) use conformance_suite;
