//! Tests of the application protocol's encoding and decoding.
#![allow(clippy::unwrap_used)]

use super::*;

const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 1, 2, 3]);

fn all_responses() -> Vec<Response> {
    vec![
        Response::Hello {
            mac: MAC,
            region_len: 2 << 20,
            max_channels: 16,
        },
        Response::Region {
            token: 7,
            region_len: 2 << 20,
            fd_offset: 4 << 20,
        },
        Response::Pending { token: 8 },
        Response::Success {
            token: 9,
            channel: ChannelId(101),
            worker: 1,
            cpu: Some(3),
            addr: ChannelAddr::new(MAC, 42),
        },
        Response::Success {
            token: 10,
            channel: ChannelId(102),
            worker: 0,
            cpu: None,
            addr: ChannelAddr::new(MAC, 1),
        },
        Response::Failure {
            token: 11,
            reason: AgentFailure::Engine(FailureReason::EndpointTaken),
            detail: "endpoint 1 is taken".into(),
        },
        Response::Failure {
            token: 12,
            reason: AgentFailure::NoMemory,
            detail: String::new(),
        },
        Response::Destroyed {
            token: 13,
            channel: ChannelId(101),
        },
    ]
}

#[test]
fn requests_and_responses_round_trip() {
    for r in [
        Request::Create {
            token: 1,
            endpoint: 5,
            ring_size: 256,
        },
        Request::Mapped { token: 2 },
        Request::Destroy {
            token: 3,
            channel: ChannelId(9),
        },
        Request::Cancel { token: 4 },
    ] {
        let b = r.encode();
        assert_eq!(Request::decode(&b), Ok(r));
        assert_eq!(request_token(&b), Some(r.token()));
    }
    for r in all_responses() {
        let b = r.encode();
        assert!(b.len() <= MAX_MESSAGE_LEN);
        assert_eq!(Response::decode(&b).unwrap(), r);
    }
}

#[test]
fn every_failure_code_round_trips() {
    let mut reasons: Vec<AgentFailure> = FailureReason::ALL
        .iter()
        .map(|r| AgentFailure::Engine(*r))
        .collect();
    reasons.extend([
        AgentFailure::BadRequest,
        AgentFailure::NoMemory,
        AgentFailure::TooManyChannels,
        AgentFailure::Nic,
        AgentFailure::UnknownToken,
        AgentFailure::NotYourChannel,
        AgentFailure::ShuttingDown,
        AgentFailure::Memory,
        AgentFailure::UidChannelQuota,
        AgentFailure::UidMemoryQuota,
        AgentFailure::EndpointOwned,
    ]);
    let codes: std::collections::HashSet<u16> = reasons.iter().map(|r| r.code()).collect();
    assert_eq!(codes.len(), reasons.len(), "two failures share a code");
    for r in reasons {
        assert_eq!(AgentFailure::from_code(r.code()), Ok(r));
        let failure = Response::Failure {
            token: 9,
            reason: r,
            detail: format!("{r}"),
        };
        assert_eq!(Response::decode(&failure.encode()), Ok(failure));
    }
    assert_eq!(
        AgentFailure::from_code(0),
        Err(ProtocolError::FailureCode(0))
    );
    assert_eq!(
        AgentFailure::from_code(0x1ff),
        Err(ProtocolError::FailureCode(0x1ff))
    );
}

#[test]
fn a_long_detail_is_cut_at_a_character_boundary() {
    let detail = "é".repeat(200); // 400 bytes
    let b = Response::Failure {
        token: 1,
        reason: AgentFailure::Nic,
        detail,
    }
    .encode();
    assert!(b.len() <= 12 + MAX_DETAIL_LEN);
    match Response::decode(&b).unwrap() {
        Response::Failure { detail, .. } => assert_eq!(detail, "é".repeat(120)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_messages_are_refused() {
    let create = Request::Create {
        token: 1,
        endpoint: 2,
        ring_size: 256,
    }
    .encode();
    assert_eq!(Request::decode(&create[..5]), Err(ProtocolError::Short(5)));
    let mut v = create.clone();
    v[0] = 2;
    assert_eq!(Request::decode(&v), Err(ProtocolError::Version { got: 2 }));
    let mut v = create.clone();
    v[1] = 9;
    assert!(matches!(
        Request::decode(&v),
        Err(ProtocolError::Kind { kind: 9, .. })
    ));
    let mut v = create.clone();
    v[3] = 1;
    assert!(matches!(
        Request::decode(&v),
        Err(ProtocolError::Reserved { offset: 3, .. })
    ));
    let mut v = create.clone();
    v.push(0);
    assert!(matches!(
        Request::decode(&v),
        Err(ProtocolError::Length { len: 17, .. })
    ));
    assert!(matches!(
        Request::decode(&Request::Mapped { token: 1 }.encode()[..7]),
        Err(ProtocolError::Short(7))
    ));

    for r in all_responses() {
        let b = r.encode();
        let mut longer = b.clone();
        longer.resize(12 + MAX_DETAIL_LEN + 1, 0);
        assert!(Response::decode(&longer).is_err(), "{r:?} + junk");
        if !matches!(r, Response::Failure { .. }) {
            assert!(Response::decode(&b[..b.len() - 1]).is_err(), "{r:?} cut");
        }
    }
    let mut hello = all_responses()[0].encode();
    hello[4] = 1;
    assert!(matches!(
        Response::decode(&hello),
        Err(ProtocolError::Field { .. })
    ));
    let mut success = all_responses()[3].encode();
    success[16..20].copy_from_slice(&(-2i32).to_le_bytes());
    assert!(matches!(
        Response::decode(&success),
        Err(ProtocolError::Field { .. })
    ));
    let mut success = all_responses()[3].encode();
    success[27] = 1;
    assert!(matches!(
        Response::decode(&success),
        Err(ProtocolError::Reserved { offset: 27, .. })
    ));
    let mut failure = all_responses()[5].encode();
    failure[12] = 0xff;
    assert_eq!(Response::decode(&failure), Err(ProtocolError::Detail));
    let mut failure = all_responses()[5].encode();
    failure[8..10].copy_from_slice(&0u16.to_le_bytes());
    assert_eq!(
        Response::decode(&failure),
        Err(ProtocolError::FailureCode(0))
    );
}
