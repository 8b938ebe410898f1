//! The decision's unit tests: batches summarised, the default rank of unreadable points.

use super::*;

fn policy() -> Policy {
    let files = crate::policy::PolicyFiles::from_texts(
        "[streams.a]\nsupersession = \"self-superseding\"\n",
        Some(
            "default_rank = 50\n[[areas]]\nname = \"far\"\nrank = 90\ncells = [\"841f1d5ffffffff\"]\n",
        ),
    );
    crate::policy::compile(&files).unwrap().policy
}

fn event(coordinates: Coordinates, time: EventTime) -> EventFacts {
    EventFacts {
        coordinates,
        time,
        stream: None,
        device: None,
        ambiguous: false,
    }
}

#[test]
fn a_batch_with_an_untimed_event_is_not_stale() {
    let p = policy();
    let a = p.stream("a");
    let old = event(Coordinates::Missing, EventTime::At(UnixMillis(0)));
    let untimed = event(Coordinates::Missing, EventTime::Missing);
    let (_, facts) = summarise(&p, BodyState::Json, &[old, untimed], |_| a);
    assert_eq!(facts.time, EventTime::Missing);
}

#[test]
fn an_unreadable_point_counts_at_the_default_rank() {
    let p = policy();
    let a = p.stream("a");
    // Berlin's cell is rank 90 in this policy; an unreadable point makes it rank 50.
    let berlin = event(Coordinates::new(52.52, 13.405), EventTime::Missing);
    let unreadable = event(Coordinates::Invalid, EventTime::Missing);
    let rank_of = |events: &[EventFacts]| {
        let (_, facts) = summarise(&p, BodyState::Json, events, |_| a);
        let d = decide(
            &p,
            a,
            &facts,
            UnixMillis(0),
            Pressure::ZERO,
            0.5,
            &Load::IDLE,
            None,
        );
        d.rank.get()
    };
    assert_eq!(rank_of(&[berlin.clone(), unreadable]), 50);
    assert_eq!(rank_of(&[berlin.clone(), berlin]), 90);
}
